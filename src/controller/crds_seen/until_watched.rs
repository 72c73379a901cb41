//! A reconcile waiting for the CRD watch to deliver its patch (`until_watched`), so that
//! watchers have seen it too.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::oneshot;

use super::CrdsSeen;
use crate::sync::lock;

impl CrdsSeen {
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

/// Drops the senders of `name` for the versions `delivered` picks, and those no one waits on.
pub(super) fn forget_senders(
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kube::runtime::watcher;

    use super::*;
    use crate::controller::crds_seen::RECENT_DELIVERIES;
    use crate::controller::crds_seen::testing::{crd, up};

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
