//! The CRDs kept as last read or patched (as JSON, within a budget), served while the CRD
//! watch is up and saw nothing newer; an answer the watch overtook (`Ticket`) is neither
//! recorded nor kept.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::{CrdsSeen, State, Ticket, record_in};
use crate::sync::lock;

/// The most the CRDs kept as last read may take (as JSON): past it, a CRD not kept yet is
/// read from the apiserver's watch cache each time. 1,000 governed CRDs of 32 KiB fit.
pub const KEPT_CRDS_AT_MOST: usize = 32 * 1024 * 1024;

impl CrdsSeen {
    /// Keeping at most `bytes` of CRDs.
    pub fn with_budget(self, bytes: usize) -> Self {
        lock(&self.state).budget = Some(bytes);
        self
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
}

impl State {
    /// Whether the watch delivered `name` after `ticket` was taken, last at another version
    /// than `answered` (its delivery of the answer itself, a patch's own event, is no news).
    fn overtaken(&self, name: &str, ticket: Ticket, answered: &str) -> bool {
        self.delivered_at.get(name).is_some_and(|at| *at > ticket.0)
            && self.watched.get(name).is_none_or(|last| last != answered)
    }

    pub(super) fn forget(&mut self, name: &str) {
        if let Some((_, json)) = self.kept.remove(name) {
            self.kept_bytes -= json.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::PartialObjectMeta;
    use kube::runtime::watcher;

    use super::*;
    use crate::controller::crds_seen::testing::{crd, up};

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
}
