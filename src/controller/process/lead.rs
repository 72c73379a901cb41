//! Leadership, term after term: wait for the Lease (when elected), run the controller
//! until shutdown, a failed essential task or a lost lease; after a lost lease, stand by and
//! try again in the same process.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::Client;
use tracing::{error, warn};

use super::http::Health;
use super::leader::{LeaderElector, LeaseError};
use super::settings::{RunError, RunSettings, SHUTDOWN_GRACE};
use crate::clock::Clock;
use crate::controller::metrics::Metrics;
use crate::controller::watch::controller;
use crate::supervise::Supervisor;
use crate::webhook::ca::WebhookEndpoint;

/// Waits for leadership (when elected), then runs the controller on `clock` until
/// `shutdown` or a failed essential task; releases the lease unless it was lost.
///
/// A lost lease (no renewal for the renew deadline: an apiserver restart, a partition)
/// stops every writer at once and makes this replica a standby again in the same process:
/// it waits for leadership anew, then starts a new controller with empty memory, as a
/// restarted process would. The conversion webhook, the probes and the metrics serve on
/// throughout: exiting would cut the connections of reviews in flight (an `EOF` to the
/// apiserver's client where it speaks HTTP/1.1 to webhooks, as v1.24 does).
#[allow(clippy::too_many_arguments)]
pub(super) async fn lead(
    client: Client,
    settings: RunSettings,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    webhook: Option<Arc<WebhookEndpoint>>,
    clock: Clock,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
    supervisor: &mut Supervisor,
) -> Result<(), RunError> {
    let elector = settings
        .lease
        .clone()
        .map(|lease| Arc::new(LeaderElector::new(client.clone(), lease)));
    // After a lost lease: the standby's growing pauses, and the one before the next try.
    let mut standby: Option<backon::ExponentialBackoff> = None;
    let mut pause = Duration::ZERO;
    loop {
        if let Some(ended) = pause_before_next_term(pause, shutdown.clone(), supervisor).await {
            return ended;
        }
        let acquired = match &elector {
            Some(elector) => match acquire(elector, &health, &metrics, shutdown.clone(), supervisor).await? {
                Some(acquired) => acquired,
                None => return Ok(()),
            },
            None => tokio::time::Instant::now(),
        };

        let controller = controller(
            client.clone(),
            settings.clone(),
            metrics.clone(),
            health.clone(),
            webhook.clone(),
            clock.clone(),
            shutdown.clone(),
        );
        // Leadership lost or a task failed: dropping the controller future stops every writer
        // at once (reconciles with it, background jobs through `StopJobs`, the sampler and the
        // CA bundle keeper with the term's `Supervisor`).
        let hold = hold(elector.as_deref(), acquired);
        let deadline = grace_after(shutdown.clone());
        // A lost lease first: a controller that ended at the same instant still reports it.
        let result = tokio::select! {
            biased;
            lost = hold => {
                pause = stand_by(acquired, &settings, &mut standby);
                error!(error = %lost, standby = ?pause, "lost leadership; stopped every writer, standing by to lead again");
                metrics.leader.set(0);
                metrics.leadership_losses.inc();
                metrics.forget_policies();
                // A standby is ready (its webhook stays in the Service), also while it
                // pauses; a term that had not listed its policies yet left this false.
                health.ready.store(true, Ordering::Relaxed);
                continue;
            }
            result = controller => result,
            () = deadline => {
                warn!("the controller did not stop within {SHUTDOWN_GRACE:?} of the shutdown signal; stopping it anyway");
                Ok(())
            }
            failed = supervisor.first_failure() => {
                error!(error = %failed, "an essential task stopped; exiting");
                health.alive.store(false, Ordering::Relaxed);
                Err(failed.into())
            }
        };
        metrics.leader.set(0);
        if let Some(elector) = &elector {
            elector.release().await;
        }
        return result;
    }
}

/// The pause of a standby after a lost lease (none at the first term); `Some` when the
/// process ends meanwhile: at `shutdown` (the lease was lost, so there is nothing to release)
/// or when an essential task fails.
async fn pause_before_next_term(
    pause: Duration,
    shutdown: impl Future<Output = ()>,
    supervisor: &mut Supervisor,
) -> Option<Result<(), RunError>> {
    if pause.is_zero() {
        return None;
    }
    tokio::select! {
        biased;
        () = shutdown => Some(Ok(())),
        failed = supervisor.first_failure() => Some(Err(failed.into())),
        () = tokio::time::sleep(pause) => None,
    }
}

/// Holds the lease `acquired` at that instant until it is lost; without election
/// (`elector` is `None`) leadership is never lost.
async fn hold(elector: Option<&LeaderElector>, acquired: tokio::time::Instant) -> LeaseError {
    match elector {
        Some(elector) => elector.hold(acquired).await,
        None => std::future::pending().await,
    }
}

/// Ends `SHUTDOWN_GRACE` after `shutdown`: SIGTERM stops the controller within it whatever
/// the watches are doing (refused, retrying, stalled); in-flight reconciles get that long to
/// finish.
async fn grace_after(shutdown: impl Future<Output = ()>) {
    shutdown.await;
    tokio::time::sleep(SHUTDOWN_GRACE).await;
}

/// Waits for the Lease, as a standby that is healthy and ready but does not reconcile;
/// `None` when `shutdown` came first.
async fn acquire(
    elector: &LeaderElector,
    health: &Health,
    metrics: &Metrics,
    shutdown: impl Future<Output = ()>,
    supervisor: &mut Supervisor,
) -> Result<Option<tokio::time::Instant>, RunError> {
    health.ready.store(true, Ordering::Relaxed);
    let acquired = tokio::select! {
        biased;
        () = shutdown => {
            // An acquiring write that landed as the signal came would keep the lease
            // from the others for a whole lease duration: released if it is held.
            elector.release().await;
            return Ok(None);
        }
        failed = supervisor.first_failure() => return Err(failed.into()),
        sent = elector.acquire() => sent,
    };
    metrics.leader.set(1);
    // The leader is ready once it has listed the policies (see `controller`). One that serves
    // the conversion webhook stays ready meanwhile, as the standby was: it lists them in
    // milliseconds, and dropping readiness would take its webhook out of the Service while
    // the old leader drains (no replica left to convert); it becomes not ready only if the
    // list takes over `LIST_GRACE`.
    if health.webhook.is_none() {
        health.ready.store(false, Ordering::Relaxed);
    }
    Ok(Some(acquired))
}

/// How long a replica whose term (from `acquired`) ended with a lost lease stands by.
///
/// The controller future is dropped as the lease is lost: nothing of this term writes any
/// more, but requests it sent may still land. So this replica stands by at least a lease
/// duration, as long as any other replica waits before taking over a lease it saw
/// unrenewed (its own record would let it renew at once), and longer after each term that
/// ended so (an apiserver too loaded to renew should not be sent a new term's lists and
/// reads every few seconds), back to a lease duration after a term of an hour.
fn stand_by(
    acquired: tokio::time::Instant,
    settings: &RunSettings,
    standby: &mut Option<backon::ExponentialBackoff>,
) -> Duration {
    if acquired.elapsed() >= STABLE_TERM {
        *standby = None;
    }
    // Only an elected replica loses a lease: `settings.lease` is set.
    let lease_duration = settings
        .lease
        .as_ref()
        .map(|l| l.lease_duration)
        .unwrap_or_default();
    standby
        .get_or_insert_with(|| standby_backoff(lease_duration))
        .next()
        .unwrap_or(MAX_STANDBY)
}

/// The longest a replica that lost its lease stands by before it tries to lead again.
const MAX_STANDBY: Duration = Duration::from_secs(300);

/// A term at least this long resets the standby to a lease duration.
const STABLE_TERM: Duration = Duration::from_secs(3600);

/// From a lease duration, doubling after each lost term, up to `MAX_STANDBY`.
fn standby_backoff(lease_duration: Duration) -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::new()
        .with_min_delay(lease_duration)
        .with_max_delay(MAX_STANDBY)
        .without_max_times()
        .build()
}
