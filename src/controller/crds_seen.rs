//! What this process knows of each CRD: the newest resourceVersion its CRD watch delivered
//! (and its own reads and patches), and, within a memory budget, the CRDs as last read or
//! patched, for a reconcile to read its CRD without a request while the watch is up and saw
//! nothing newer (`context::get_crd_seen`); and when its watch delivered a version, for a
//! reconcile to know that its patch has reached watchers (`until_watched`).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use tokio::sync::oneshot;

use crate::sync::lock;

/// The newest resourceVersion of each CRD this process saw (every CRD of the cluster, a
/// name and a number each), and the CRDs it read or patched last, as JSON.
/// resourceVersions are opaque, so the last one recorded wins: a relist from an apiserver
/// behind may record an older one, which only makes a read less fresh (the CRD patch is
/// guarded by the resourceVersion it decided on, `patch::crd_patch`).
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
    /// Whether a CRD watch feeds this (`watch_event`) and listed every CRD since it started
    /// or relisted. Without one (a bare reconcile's), nothing would tell a kept CRD is stale.
    listed: bool,
    /// When the watch last failed, while it has not shown since that it flows again.
    /// kube-runtime's watcher resumes a failed watch (a 429 or 5xx as it starts) from its
    /// last resourceVersion without listing again, so no `InitDone` says it is back: an
    /// event delivered since does, and so does `RESUMED_AFTER` without a new failure (the
    /// watcher retries at most every 30 s plus jitter, and reports each failure).
    failed_at: Option<tokio::time::Instant>,
    /// Reconciles waiting for the watch to deliver a resourceVersion, by CRD name.
    waiting: HashMap<String, Vec<(String, oneshot::Sender<()>)>>,
    /// CRDs as last read or patched, as JSON (a decoded schema takes many times its JSON
    /// size), by name, with their resourceVersion.
    kept: HashMap<String, (String, Vec<u8>)>,
    /// What `kept` holds, in bytes.
    kept_bytes: usize,
    /// The most `kept` may hold (`KEPT_CRDS_AT_MOST` when unset).
    budget: Option<usize>,
    /// How many deliveries the CRD watch made so far, and the number of each CRD's last
    /// (for `Ticket`).
    deliveries: u64,
    delivered_at: HashMap<String, u64>,
    /// The CRDs a relist under way delivered so far: those it did not deliver were deleted
    /// while the watch was away, and are forgotten as it ends (`InitDone`).
    relisted: Option<std::collections::HashSet<String>>,
    /// The last `RECENT_DELIVERIES` deliveries (CRD name, resourceVersion): a patch whose
    /// event the watch delivered before its reconcile came to wait for it, and then a later
    /// one, has been delivered all the same.
    recent: VecDeque<(String, String)>,
}

/// How long a failed CRD watch, resumed by kube-runtime's watcher without a relist, must
/// go without failing again (and without delivering) to count as up again.
const RESUMED_AFTER: Duration = Duration::from_secs(120);

/// How many of the CRD watch's last deliveries `until_watched` looks back on.
const RECENT_DELIVERIES: usize = 256;

/// Taken before a request for a CRD is sent (`CrdsSeen::ticket`): its answer is recorded
/// and kept only if the CRD watch delivered nothing for that CRD while it was in flight. An
/// answer overtaken by a watch event may be older than it (resourceVersions are opaque, so
/// they cannot be compared): recording it would serve the older copy to the next reconcile,
/// which would compute no change from it, and nothing would correct that until another
/// write.
#[derive(Clone, Copy, Debug)]
pub struct Ticket(u64);

/// The most the CRDs kept as last read may take (as JSON): past it, a CRD not kept yet is
/// read from the apiserver's watch cache each time. 1,000 governed CRDs of 32 KiB fit.
pub const KEPT_CRDS_AT_MOST: usize = 32 * 1024 * 1024;

impl CrdsSeen {
    /// Keeping at most `bytes` of CRDs.
    pub fn with_budget(self, bytes: usize) -> Self {
        lock(&self.state).budget = Some(bytes);
        self
    }

    /// What the CRD watch (kube-runtime's watcher) said, before its objects are mapped: each
    /// CRD's resourceVersion (`watched`); up once it listed every CRD, down from a failure or
    /// a restart until it listed them again; a deleted CRD is forgotten. Kept CRDs serve
    /// reads only while it is up, and `until_watched` waits for it only then.
    pub fn watch_event(
        &self,
        event: &Result<watcher::Event<PartialObjectMeta<CustomResourceDefinition>>, watcher::Error>,
    ) {
        let mut state = lock(&self.state);
        match event {
            Ok(watcher::Event::Apply(crd)) => {
                if let (Some(name), Some(version)) = (&crd.metadata.name, &crd.metadata.resource_version) {
                    state.watched(name, version);
                }
                // Delivering again: a failed watch resumed.
                state.failed_at = None;
            }
            Ok(watcher::Event::InitApply(crd)) => {
                if let (Some(name), Some(version)) = (&crd.metadata.name, &crd.metadata.resource_version) {
                    state.watched(name, version);
                    if let Some(relisted) = &mut state.relisted {
                        relisted.insert(name.clone());
                    }
                }
            }
            Ok(watcher::Event::InitDone) => {
                state.listed = true;
                state.failed_at = None;
                if let Some(relisted) = state.relisted.take() {
                    let gone: Vec<String> = state
                        .seen
                        .keys()
                        .filter(|name| !relisted.contains(*name))
                        .cloned()
                        .collect();
                    for name in gone {
                        state.deleted(&name);
                    }
                }
            }
            Ok(watcher::Event::Init) => {
                state.listed = false;
                state.relisted = Some(Default::default());
                // Nothing to wait for from a watch that is down.
                state.waiting.clear();
            }
            Err(_) => {
                state.failed_at = Some(tokio::time::Instant::now());
                state.waiting.clear();
            }
            Ok(watcher::Event::Delete(crd)) => {
                state.failed_at = None;
                if let Some(name) = &crd.metadata.name {
                    state.deleted(name);
                }
            }
        }
    }

    /// The CRD watch delivered `name` at `resource_version`.
    pub fn watched(&self, name: &str, resource_version: &str) {
        lock(&self.state).watched(name, resource_version);
    }

    /// Taken before sending a request for a CRD whose answer goes to `refresh` or `keep`.
    pub fn ticket(&self) -> Ticket {
        Ticket(lock(&self.state).deliveries)
    }

    /// The resourceVersion `name` was last seen at.
    pub fn get(&self, name: &str) -> Option<String> {
        lock(&self.state).seen.get(name).cloned()
    }

    /// `crd` as just read by a quorum read sent after `ticket`: its resourceVersion is seen,
    /// and the object replaces the one kept, if one is (a CRD that only `release` or a
    /// suspended policy reads takes no room); nothing if the watch delivered it meanwhile.
    pub fn refresh(&self, crd: &CustomResourceDefinition, ticket: Ticket) {
        let (Some(name), Some(version)) = (&crd.metadata.name, &crd.metadata.resource_version) else {
            return;
        };
        let kept = {
            let mut state = lock(&self.state);
            if state.overtaken(name, ticket, version) {
                return;
            }
            let kept = state.kept.contains_key(name);
            if !kept {
                record_in(&mut state.seen, name, version);
            }
            kept
        };
        if kept {
            self.keep(crd, ticket);
        }
    }

    /// `crd` as just read or patched for a decision, in answer to a request sent after
    /// `ticket`: its resourceVersion is seen, and the object kept while the budget allows;
    /// nothing if the watch delivered it meanwhile.
    pub fn keep(&self, crd: &CustomResourceDefinition, ticket: Ticket) {
        let (Some(name), Some(version)) = (&crd.metadata.name, &crd.metadata.resource_version) else {
            return;
        };
        let json = serde_json::to_vec(crd).unwrap_or_default();
        let mut state = lock(&self.state);
        if state.overtaken(name, ticket, version) {
            return;
        }
        record_in(&mut state.seen, name, version);
        state.forget(name);
        let budget = state.budget.unwrap_or(KEPT_CRDS_AT_MOST);
        if !json.is_empty() && state.kept_bytes.saturating_add(json.len()) <= budget {
            state.kept_bytes += json.len();
            state.kept.insert(name.clone(), (version.clone(), json));
        }
    }

    /// The CRD `name` as kept, while the CRD watch is up and saw nothing newer since (by
    /// resourceVersion).
    pub fn kept(&self, name: &str) -> Option<CustomResourceDefinition> {
        let state = lock(&self.state);
        if !state.up() {
            return None;
        }
        let (version, json) = state.kept.get(name)?;
        if state.seen.get(name) != Some(version) {
            return None;
        }
        serde_json::from_slice(json).ok()
    }

    /// The CRD `name` does not exist (any more).
    pub fn forget(&self, name: &str) {
        lock(&self.state).forget(name);
    }

    /// Returns once the CRD watch has delivered `name` at `resource_version` (a patch's
    /// answer: watchers see it too by then; at once if it did among its last deliveries, even
    /// when a later change of the CRD followed), or after `limit`, or at once when no watch
    /// feeds this or it is down (and as it fails).
    pub async fn until_watched(&self, name: &str, resource_version: &str, limit: Duration) {
        let delivered = {
            let mut state = lock(&self.state);
            if !state.up()
                || state.watched.get(name).is_some_and(|v| v == resource_version)
                || state
                    .recent
                    .iter()
                    .any(|(n, v)| n == name && v == resource_version)
            {
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

impl State {
    /// Whether the CRD watch is up: listed, and not failed since, or shown to flow again.
    fn up(&self) -> bool {
        self.listed && self.failed_at.is_none_or(|at| at.elapsed() >= RESUMED_AFTER)
    }

    fn watched(&mut self, name: &str, resource_version: &str) {
        if resource_version.is_empty() {
            return;
        }
        self.deliveries += 1;
        let number = self.deliveries;
        if self.recent.len() == RECENT_DELIVERIES {
            self.recent.pop_front();
        }
        self.recent
            .push_back((name.to_owned(), resource_version.to_owned()));
        match self.delivered_at.get_mut(name) {
            Some(at) => *at = number,
            None => {
                self.delivered_at.insert(name.to_owned(), number);
            }
        }
        record_in(&mut self.seen, name, resource_version);
        record_in(&mut self.watched, name, resource_version);
        // Dropping a sender wakes its waiter; those whose wait ended go as well.
        forget_senders(&mut self.waiting, name, |version| version == resource_version);
    }

    /// `name` was deleted: forgotten, its waiters woken, and a request sent before the
    /// deletion (which may answer the CRD as it was) overtaken.
    fn deleted(&mut self, name: &str) {
        self.forget(name);
        self.seen.remove(name);
        self.watched.remove(name);
        self.waiting.remove(name);
        self.deliveries += 1;
        let number = self.deliveries;
        self.delivered_at.insert(name.to_owned(), number);
    }

    /// Whether the watch delivered `name` after `ticket` was taken, last at another version
    /// than `answered` (its delivery of the answer itself, a patch's own event, is no news).
    fn overtaken(&self, name: &str, ticket: Ticket, answered: &str) -> bool {
        self.delivered_at.get(name).is_some_and(|at| *at > ticket.0)
            && self.watched.get(name).is_none_or(|last| last != answered)
    }

    fn forget(&mut self, name: &str) {
        if let Some((_, json)) = self.kept.remove(name) {
            self.kept_bytes -= json.len();
        }
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

    fn up(seen: &CrdsSeen) {
        seen.watch_event(&Ok(watcher::Event::InitDone));
    }

    #[tokio::test(start_paused = true)]
    async fn a_patch_waits_until_the_watch_delivers_its_version_and_no_longer_than_its_limit() {
        let seen = Arc::new(CrdsSeen::default());
        up(&seen);
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
        let seen = CrdsSeen::default();
        up(&seen);
        assert!(seen.kept("a").is_none());
        seen.keep(&crd("a", "5"), seen.ticket());
        assert_eq!(seen.get("a").as_deref(), Some("5"));
        let kept = seen.kept("a").expect("kept");
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("5"));
        // The watch delivers a newer state: the kept one is stale.
        seen.watched("a", "6");
        assert!(seen.kept("a").is_none());
        // Read again.
        seen.keep(&crd("a", "6"), seen.ticket());
        assert!(seen.kept("a").is_some());
        // The watch fails: nothing would tell it stale, so it is not served until the
        // watch listed again.
        seen.watch_event(&Err(watcher::Error::NoResourceVersion));
        assert!(seen.kept("a").is_none());
        seen.watch_event(&Ok(watcher::Event::Init));
        assert!(seen.kept("a").is_none());
        let relisted: PartialObjectMeta<CustomResourceDefinition> =
            serde_json::from_value(serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1",
                "kind": "PartialObjectMetadata", "metadata": {"name": "a", "resourceVersion": "6"}}))
            .expect("metadata");
        seen.watch_event(&Ok(watcher::Event::InitApply(relisted)));
        up(&seen);
        assert!(seen.kept("a").is_some());
        // Deleted.
        let deleted: PartialObjectMeta<CustomResourceDefinition> =
            serde_json::from_value(serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1",
                "kind": "PartialObjectMetadata", "metadata": {"name": "a", "resourceVersion": "7"}}))
            .expect("metadata");
        seen.watch_event(&Ok(watcher::Event::Delete(deleted)));
        assert!(seen.kept("a").is_none());
        assert!(seen.get("a").is_none());
        assert_eq!(lock(&seen.state).kept_bytes, 0);
    }

    /// Finding 2: an answer the watch overtook (a GitOps re-apply delivered while our patch
    /// or read was in flight) is neither seen nor kept: the next reconcile reads the newer
    /// state instead of deciding on the older copy.
    #[test]
    fn an_answer_the_watch_overtook_is_not_kept() {
        let seen = CrdsSeen::default();
        up(&seen);
        seen.keep(&crd("a", "5"), seen.ticket());
        // A patch is sent; meanwhile the watch delivers someone else's write, then the
        // patch's answer arrives (older than that write).
        let ticket = seen.ticket();
        seen.watched("a", "7");
        seen.keep(&crd("a", "6"), ticket);
        assert_eq!(
            seen.get("a").as_deref(),
            Some("7"),
            "the newer version stays seen"
        );
        assert!(seen.kept("a").is_none(), "no copy older than the watch is served");
        // The same for a quorum read's answer.
        let ticket = seen.ticket();
        seen.watched("a", "9");
        seen.refresh(&crd("a", "8"), ticket);
        assert_eq!(seen.get("a").as_deref(), Some("9"));
        // A watch event of the answer itself (a patch's own event, delivered before its
        // answer) is no news: the answer is kept.
        let ticket = seen.ticket();
        seen.watched("a", "10");
        seen.keep(&crd("a", "10"), ticket);
        assert_eq!(
            seen.kept("a")
                .and_then(|c| c.metadata.resource_version)
                .as_deref(),
            Some("10")
        );
        // Events of other CRDs do not matter.
        let ticket = seen.ticket();
        seen.watched("b", "11");
        seen.keep(&crd("a", "12"), ticket);
        assert_eq!(seen.get("a").as_deref(), Some("12"));
        // Deleted while a read was in flight: its answer does not bring it back.
        let ticket = seen.ticket();
        let deleted: PartialObjectMeta<CustomResourceDefinition> =
            serde_json::from_value(serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1",
                "kind": "PartialObjectMetadata", "metadata": {"name": "a", "resourceVersion": "13"}}))
            .expect("metadata");
        seen.watch_event(&Ok(watcher::Event::Delete(deleted)));
        seen.keep(&crd("a", "12"), ticket);
        assert!(seen.get("a").is_none());
        assert!(seen.kept("a").is_none());
    }

    /// Finding 5: a patch whose event was delivered before its reconcile came to wait, then
    /// a later change of the CRD, costs no wait.
    #[tokio::test(start_paused = true)]
    async fn a_patch_delivered_before_the_wait_and_then_superseded_costs_no_wait() {
        let seen = CrdsSeen::default();
        up(&seen);
        seen.watched("a", "6");
        seen.watched("b", "7");
        seen.watched("a", "8");
        let started = tokio::time::Instant::now();
        seen.until_watched("a", "6", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        // Only the last deliveries are remembered.
        for i in 0..RECENT_DELIVERIES {
            seen.watched("c", &format!("{}", 100 + i));
        }
        seen.until_watched("a", "6", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(lock(&seen.state).recent.len(), RECENT_DELIVERIES);
    }

    /// Finding 3: kube-runtime's watcher resumes a watch whose start failed (a 429, a 5xx)
    /// without listing again: it counts as up once it delivers, or after `RESUMED_AFTER`
    /// without another failure, not only after a 410's relist.
    #[tokio::test(start_paused = true)]
    async fn a_watch_resumed_without_a_relist_is_up_again() {
        let seen = CrdsSeen::default();
        up(&seen);
        seen.keep(&crd("a", "5"), seen.ticket());
        seen.watch_event(&Err(watcher::Error::NoResourceVersion));
        assert!(seen.kept("a").is_none(), "down as it fails");
        // It delivers a change of another CRD: it flows again.
        let other: PartialObjectMeta<CustomResourceDefinition> =
            serde_json::from_value(serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1",
                "kind": "PartialObjectMetadata", "metadata": {"name": "b", "resourceVersion": "6"}}))
            .expect("metadata");
        seen.watch_event(&Ok(watcher::Event::Apply(other)));
        assert!(seen.kept("a").is_some(), "up once it delivers");
        // Failing again, then quiet: up after RESUMED_AFTER, unless it fails meanwhile.
        seen.watch_event(&Err(watcher::Error::NoResourceVersion));
        tokio::time::advance(RESUMED_AFTER - Duration::from_secs(30)).await;
        seen.watch_event(&Err(watcher::Error::NoResourceVersion));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(seen.kept("a").is_none(), "failed 60 s ago");
        tokio::time::advance(RESUMED_AFTER).await;
        assert!(seen.kept("a").is_some(), "quiet for RESUMED_AFTER");
    }

    /// A CRD deleted while the watch was away (a relist does not deliver it) is forgotten
    /// as the relist ends; a deletion wakes whoever waits on the CRD.
    #[tokio::test(start_paused = true)]
    async fn a_relist_forgets_crds_deleted_meanwhile_and_a_deletion_ends_waits() {
        let seen = Arc::new(CrdsSeen::default());
        up(&seen);
        seen.keep(&crd("gone", "5"), seen.ticket());
        seen.keep(&crd("here", "6"), seen.ticket());
        seen.watch_event(&Ok(watcher::Event::Init));
        let here: PartialObjectMeta<CustomResourceDefinition> =
            serde_json::from_value(serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1",
                "kind": "PartialObjectMetadata", "metadata": {"name": "here", "resourceVersion": "6"}}))
            .expect("metadata");
        seen.watch_event(&Ok(watcher::Event::InitApply(here)));
        up(&seen);
        assert!(seen.get("gone").is_none() && seen.kept("gone").is_none());
        assert!(seen.kept("here").is_some());
        // A reconcile waits for its patch's event; the CRD is deleted instead.
        let watch = seen.clone();
        let started = tokio::time::Instant::now();
        let deleting = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let deleted: PartialObjectMeta<CustomResourceDefinition> =
                serde_json::from_value(serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1",
                    "kind": "PartialObjectMetadata", "metadata": {"name": "here", "resourceVersion": "9"}}))
                .expect("metadata");
            watch.watch_event(&Ok(watcher::Event::Delete(deleted)));
        });
        seen.until_watched("here", "8", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        deleting.await.expect("deleted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_is_down_or_fails_makes_no_patch_wait() {
        let seen = Arc::new(CrdsSeen::default());
        let started = tokio::time::Instant::now();
        // Not listed yet.
        seen.until_watched("a", "5", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        // Up, then failing 1 s into a wait: the wait ends.
        up(&seen);
        let watch = seen.clone();
        let failing = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            watch.watch_event(&Err(watcher::Error::NoResourceVersion));
        });
        seen.until_watched("a", "5", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        failing.await.expect("failed");
    }

    #[test]
    fn kept_crds_stay_within_the_budget() {
        let size = serde_json::to_vec(&crd("c0", "1")).expect("json").len();
        let seen = CrdsSeen::default().with_budget(10 * size);
        up(&seen);
        for i in 0..20 {
            seen.keep(&crd(&format!("c{i}"), "1"), seen.ticket());
        }
        let state = lock(&seen.state);
        assert!(state.kept_bytes <= 10 * size, "{} bytes kept", state.kept_bytes);
        assert!((9..=10).contains(&state.kept.len()), "{} kept", state.kept.len());
        // Past the budget, still seen: read from the watch cache at that version.
        assert_eq!(state.seen.len(), 20);
    }

    #[test]
    fn a_quorum_read_refreshes_a_kept_crd_and_keeps_no_other() {
        let seen = CrdsSeen::default();
        up(&seen);
        seen.refresh(&crd("released", "3"), seen.ticket());
        assert!(seen.kept("released").is_none());
        assert_eq!(seen.get("released").as_deref(), Some("3"));
        seen.keep(&crd("governed", "4"), seen.ticket());
        seen.refresh(&crd("governed", "5"), seen.ticket());
        let kept = seen.kept("governed").expect("kept");
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("5"));
    }

    #[tokio::test(start_paused = true)]
    async fn until_a_watch_listed_nothing_kept_is_served_and_nothing_waits() {
        let seen = CrdsSeen::default();
        seen.keep(&crd("a", "5"), seen.ticket());
        assert!(seen.kept("a").is_none());
        assert_eq!(seen.get("a").as_deref(), Some("5"));
        let started = tokio::time::Instant::now();
        seen.until_watched("a", "6", Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        seen.watched("a", "6");
        seen.watched("a", "");
        assert_eq!(seen.get("a").as_deref(), Some("6"));
    }
}
