//! What this process knows of each CRD: the newest resourceVersion it saw (its CRD watch,
//! its reads, the answers to its own patches) and, within a memory budget, the governed CRDs
//! as last read or patched, for a reconcile to read its CRD without a request while nothing
//! newer was seen (`context::get_crd_seen`); and when its watch delivered a version, for a
//! reconcile to know that its patch has reached watchers (`until_watched`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use tokio::sync::oneshot;

use crate::sync::lock;

/// The newest resourceVersion of each CRD this process saw (every CRD of the cluster, a
/// name and a number each). resourceVersions are opaque, so the last one recorded wins; an
/// older one only makes a read less fresh, never wrong (`context::get_crd_seen`).
#[derive(Debug, Default)]
pub struct CrdsSeen {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The newest resourceVersion seen, by CRD name.
    seen: HashMap<String, String>,
    /// The last resourceVersion the CRD watch delivered, by CRD name.
    watched: HashMap<String, String>,
    /// Whether a CRD watch feeds `watched` (the controller's; not a bare reconcile's).
    watching: bool,
    /// Reconciles waiting for the watch to deliver a resourceVersion, by CRD name.
    waiting: HashMap<String, Vec<(String, oneshot::Sender<()>)>>,
    /// CRDs as last read or patched, by name, with their size as JSON.
    kept: HashMap<String, (Arc<CustomResourceDefinition>, usize)>,
    /// What `kept` holds, as JSON.
    kept_bytes: usize,
    /// The most `kept` may hold (`KEPT_CRDS_AT_MOST` when unset).
    budget: Option<usize>,
}

/// The most the CRDs kept as last read may take (as JSON): past it, a CRD not kept yet is
/// read from the apiserver's watch cache each time. 1,000 governed CRDs of 64 KiB fit.
pub const KEPT_CRDS_AT_MOST: usize = 64 * 1024 * 1024;

impl CrdsSeen {
    /// Seen fed by a CRD watch (`watched`): `until_watched` waits for it.
    pub fn watched_by_a_watch() -> Self {
        let seen = Self::default();
        lock(&seen.state).watching = true;
        seen
    }

    /// The CRD watch delivered `name` at `resource_version`.
    pub fn watched(&self, name: &str, resource_version: &str) {
        if resource_version.is_empty() {
            return;
        }
        let mut state = lock(&self.state);
        record_in(&mut state.seen, name, resource_version);
        record_in(&mut state.watched, name, resource_version);
        // Dropping a sender wakes its waiter; those whose wait ended go as well.
        forget_senders(&mut state.waiting, name, |version| version == resource_version);
    }

    /// The resourceVersion `name` was last seen at.
    pub fn get(&self, name: &str) -> Option<String> {
        lock(&self.state).seen.get(name).cloned()
    }

    /// The same, keeping at most `bytes` of CRDs.
    pub fn with_budget(self, bytes: usize) -> Self {
        lock(&self.state).budget = Some(bytes);
        self
    }

    /// `crd` as just read or patched: its resourceVersion is seen, and the object kept
    /// while the budget allows.
    pub fn keep(&self, crd: &CustomResourceDefinition) {
        let (Some(name), Some(version)) = (&crd.metadata.name, &crd.metadata.resource_version) else {
            return;
        };
        let size = serde_json::to_vec(crd).map_or(usize::MAX, |json| json.len());
        let mut state = lock(&self.state);
        record_in(&mut state.seen, name, version);
        if let Some((_, old)) = state.kept.remove(name) {
            state.kept_bytes -= old;
        }
        if state.kept_bytes.saturating_add(size) <= state.budget.unwrap_or(KEPT_CRDS_AT_MOST) {
            state.kept.insert(name.clone(), (Arc::new(crd.clone()), size));
            state.kept_bytes += size;
        }
    }

    /// The CRD `name` as kept, if a CRD watch feeds this and saw nothing newer since (by
    /// resourceVersion). Without a watch, nothing tells a kept CRD is stale.
    pub fn kept(&self, name: &str) -> Option<Arc<CustomResourceDefinition>> {
        let state = lock(&self.state);
        if !state.watching {
            return None;
        }
        let (crd, _) = state.kept.get(name)?;
        (crd.metadata.resource_version.as_ref() == state.seen.get(name)).then(|| crd.clone())
    }

    /// The CRD `name` does not exist (any more).
    pub fn forget(&self, name: &str) {
        let mut state = lock(&self.state);
        if let Some((_, size)) = state.kept.remove(name) {
            state.kept_bytes -= size;
        }
    }

    /// Returns once the CRD watch has delivered `name` at `resource_version` (a patch's
    /// answer: watchers see it too by then), or after `limit` (the watch restarted and
    /// listed a newer state, or someone changed the CRD again right away), or at once when
    /// no watch feeds this.
    pub async fn until_watched(&self, name: &str, resource_version: &str, limit: Duration) {
        let delivered = {
            let mut state = lock(&self.state);
            if !state.watching || state.watched.get(name).is_some_and(|v| v == resource_version) {
                return;
            }
            let (sender, delivered) = oneshot::channel();
            state
                .waiting
                .entry(name.to_owned())
                .or_default()
                .push((resource_version.to_owned(), sender));
            delivered
        };
        // A dropped sender (woken) and an answer are the same news.
        let _ = tokio::time::timeout(limit, delivered).await;
        forget_senders(&mut lock(&self.state).waiting, name, |_| false);
    }
}

/// Drops the senders of `name` for the versions `delivered` picks, and those no one waits on.
fn forget_senders(
    waiting: &mut HashMap<String, Vec<(String, oneshot::Sender<()>)>>,
    name: &str,
    delivered: impl Fn(&str) -> bool,
) {
    if let Some(senders) = waiting.get_mut(name) {
        senders.retain(|(version, sender)| !delivered(version) && !sender.is_closed());
        if senders.is_empty() {
            waiting.remove(name);
        }
    }
}

fn record_in(map: &mut HashMap<String, String>, name: &str, resource_version: &str) {
    match map.get_mut(name) {
        Some(known) if known == resource_version => {}
        Some(known) => resource_version.clone_into(known),
        None => {
            map.insert(name.to_owned(), resource_version.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn a_patch_waits_until_the_watch_delivers_its_version_and_no_longer_than_its_limit() {
        let seen = Arc::new(CrdsSeen::watched_by_a_watch());
        // Delivered before the wait: none.
        seen.watched("a", "5");
        let started = tokio::time::Instant::now();
        seen.until_watched("a", "5", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        // Delivered 2 s into the wait.
        let watch = seen.clone();
        let delivering = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            watch.watched("a", "6");
        });
        seen.until_watched("a", "6", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        delivering.await.expect("delivered");
        // Another version of it, or another CRD, does not end the wait: the limit does,
        // and nothing is left waiting.
        seen.watched("b", "7");
        seen.watched("a", "8");
        seen.until_watched("a", "7", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(7));
        assert!(lock(&seen.state).waiting.is_empty());
        assert_eq!(seen.get("a").as_deref(), Some("8"));
    }

    fn crd(name: &str, version: &str) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": version},
            "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"},
                     "scope": "Namespaced", "versions": []}}))
        .expect("a CRD")
    }

    #[test]
    fn a_kept_crd_serves_until_a_newer_version_is_seen() {
        let seen = CrdsSeen::watched_by_a_watch();
        assert!(seen.kept("a").is_none());
        seen.keep(&crd("a", "5"));
        assert_eq!(seen.get("a").as_deref(), Some("5"));
        let kept = seen.kept("a").expect("kept");
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("5"));
        // The watch delivers a newer state: the kept one is stale.
        seen.watched("a", "6");
        assert!(seen.kept("a").is_none());
        // Read again.
        seen.keep(&crd("a", "6"));
        assert!(seen.kept("a").is_some());
        // Deleted.
        seen.forget("a");
        assert!(seen.kept("a").is_none());
        assert_eq!(lock(&seen.state).kept_bytes, 0);
    }

    #[test]
    fn kept_crds_stay_within_the_budget() {
        let size = serde_json::to_vec(&crd("c0", "1")).expect("json").len();
        let seen = CrdsSeen::watched_by_a_watch().with_budget(10 * size);
        for i in 0..20 {
            seen.keep(&crd(&format!("c{i}"), "1"));
        }
        let state = lock(&seen.state);
        assert!(state.kept_bytes <= 10 * size, "{} bytes kept", state.kept_bytes);
        assert!((9..=10).contains(&state.kept.len()), "{} kept", state.kept.len());
        // Past the budget, still seen: read from the watch cache at that version.
        assert_eq!(state.seen.len(), 20);
    }

    #[test]
    fn without_a_watch_nothing_kept_is_served() {
        let seen = CrdsSeen::default();
        seen.keep(&crd("a", "5"));
        assert!(seen.kept("a").is_none());
        assert_eq!(seen.get("a").as_deref(), Some("5"));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_watch_nothing_waits() {
        let seen = CrdsSeen::default();
        let started = tokio::time::Instant::now();
        seen.until_watched("a", "5", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        seen.watched("a", "5");
        seen.watched("a", "");
        assert_eq!(seen.get("a").as_deref(), Some("5"));
    }
}
