//! What this process knows of each CRD's resourceVersion: the newest it saw (its CRD watch,
//! its reads, the answers to its own patches), for reads from the apiserver's watch cache
//! (`context::get_crd_seen`), and when its watch delivered a version, for a reconcile to
//! know that its patch has reached watchers (`until_watched`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

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
}

impl CrdsSeen {
    /// Seen fed by a CRD watch (`watched`): `until_watched` waits for it.
    pub fn watched_by_a_watch() -> Self {
        let seen = Self::default();
        lock(&seen.state).watching = true;
        seen
    }

    /// `name` was read or written at `resource_version`.
    pub fn record(&self, name: &str, resource_version: &str) {
        if !resource_version.is_empty() {
            record_in(&mut lock(&self.state).seen, name, resource_version);
        }
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

    #[tokio::test(start_paused = true)]
    async fn without_a_watch_nothing_waits() {
        let seen = CrdsSeen::default();
        let started = tokio::time::Instant::now();
        seen.until_watched("a", "5", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        seen.record("a", "5");
        seen.record("a", "");
        assert_eq!(seen.get("a").as_deref(), Some("5"));
    }
}
