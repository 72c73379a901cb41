//! Transitions land before bookkeeping. When many policies are due at the same instant
//! (1,000 introductions in one second), each reconcile sends its CRD patch and then its
//! Events and status; on a busy apiserver the bookkeeping of the first ones would compete
//! with the patches of the others and make them late. So the bookkeeping of a reconcile
//! waits, at most `BOOKKEEPING_WAITS_AT_MOST`, while other reconciles are still on their
//! way to their patch (reading the CRD and deciding) or to its landing: until the
//! controller's CRD watch delivers the patch (`WATCH_DELIVERS_WITHIN` at most), as every
//! other watcher's does about then. Nothing else waits on it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// The longest a reconcile's Events and status wait for other reconciles' patches.
pub const BOOKKEEPING_WAITS_AT_MOST: Duration = Duration::from_secs(10);

/// The longest a reconcile that patched its CRD waits for its own CRD watch to deliver the
/// patch (watchers see a transition then), still counted on its way.
pub const WATCH_DELIVERS_WITHIN: Duration = Duration::from_secs(5);

/// How many reconciles are on their way to their CRD patch.
#[derive(Debug, Default)]
pub struct PatchesFirst {
    on_the_way: AtomicUsize,
    arrived: Notify,
}

/// A reconcile on its way to its patch, until dropped.
pub struct OnTheWay<'a>(&'a PatchesFirst);

impl Drop for OnTheWay<'_> {
    fn drop(&mut self) {
        if self.0.on_the_way.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.arrived.notify_waiters();
        }
    }
}

impl PatchesFirst {
    /// A reconcile starts reading and deciding (and maybe patching) its CRD.
    pub fn on_the_way(&self) -> OnTheWay<'_> {
        self.on_the_way.fetch_add(1, Ordering::AcqRel);
        OnTheWay(self)
    }

    /// Returns once no reconcile is on its way to its patch, or after `limit`.
    pub async fn after_patches(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if self.on_the_way.load(Ordering::Acquire) == 0 {
                return;
            }
            // `biased`: a fixed order (here and in every select of the controller) makes a
            // run on tokio's paused clock replay exactly (tests/simulation).
            tokio::select! {
                biased;
                () = arrived => {}
                () = tokio::time::sleep_until(deadline) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bookkeeping_waits_for_patches_on_their_way_and_no_longer_than_its_limit() {
        let patches = std::sync::Arc::new(PatchesFirst::default());
        // Nothing on its way: no wait.
        let started = tokio::time::Instant::now();
        patches.after_patches(Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        // One on its way for 2 s.
        let on_the_way = patches.clone();
        let patching = tokio::spawn(async move {
            let _guard = on_the_way.on_the_way();
            tokio::time::sleep(Duration::from_secs(2)).await;
        });
        tokio::task::yield_now().await;
        patches.after_patches(Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        patching.await.expect("patched");
        // One that never arrives: the limit.
        let _stuck = patches.on_the_way();
        patches.after_patches(Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(12));
    }
}
