//! Small synchronisation helpers.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex whose data stays consistent even if a holder panicked (every critical
/// section here is a plain read or assignment), instead of propagating the poison.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a watch has listed once (its first `InitDone`), for any number of waiters.
///
/// kube-runtime 5's `Store::wait_until_ready` keeps one waker only (`utils::delayed_init`
/// polls a `futures` oneshot receiver): of several tasks waiting on one store, only the last
/// to poll is woken, the others stay asleep until something else polls them. Two waiters on
/// one store here (a readiness flag and a reader, or kube-runtime's own `Controller`) cost
/// seconds, once the full length of a timeout. A watch stream reports its lists here instead
/// (`Listed::inspect`).
#[derive(Clone, Debug)]
pub struct Listed(tokio::sync::watch::Receiver<bool>);

impl Listed {
    /// A flag, and the function a watch stream's `inspect` calls with each event.
    pub fn new<K>() -> (
        Listed,
        impl Fn(&Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>) + Send + Sync + 'static,
    ) {
        let (sender, receiver) = tokio::sync::watch::channel(false);
        let inspect =
            move |event: &Result<kube::runtime::watcher::Event<K>, kube::runtime::watcher::Error>| {
                if matches!(event, Ok(kube::runtime::watcher::Event::InitDone)) {
                    sender.send_replace(true);
                }
            };
        (Listed(receiver), inspect)
    }

    /// A watch that never lists (nothing behind it): every wait ends at once, `false`.
    pub fn never() -> Listed {
        Listed(tokio::sync::watch::channel(false).1)
    }

    /// Waits until the watch has listed once: `true`, or `false` once it is gone unlisted.
    pub async fn wait(&self) -> bool {
        self.0.clone().wait_for(|listed| *listed).await.is_ok()
    }

    /// Waits until every one of `watches` has listed once: `false` as soon as one is gone
    /// unlisted.
    pub async fn all(watches: &[Listed]) -> bool {
        for watch in watches {
            if !watch.wait().await {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    #[tokio::test]
    async fn every_waiter_wakes_when_the_watch_lists() {
        let (listed, inspect) = Listed::new::<()>();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let listed = listed.clone();
                tokio::spawn(async move { listed.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        inspect(&Ok(Event::Init));
        inspect(&Ok(Event::InitDone));
        for waiter in waiters {
            assert!(waiter.await.expect("a waiter"));
        }
        assert!(listed.wait().await, "listed stays listed");
        assert!(!Listed::never().wait().await);
        assert!(Listed::all(&[listed.clone(), listed.clone()]).await);
        assert!(!Listed::all(&[listed, Listed::never()]).await);
    }
}
