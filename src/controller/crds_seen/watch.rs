//! What the CRD watch delivers: each CRD's resourceVersion, deletions, and whether the
//! watch is up (listed, and not failed since).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;

use super::until_watched::forget_senders;
use super::{CrdsSeen, RECENT_DELIVERIES, RESUMED_AFTER, State, record_in};
use crate::sync::lock;

impl CrdsSeen {
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
}

impl State {
    /// Whether the CRD watch is up: listed, and not failed since, or shown to flow again.
    pub(super) fn up(&self) -> bool {
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
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::controller::crds_seen::testing::{crd, up};

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
}
