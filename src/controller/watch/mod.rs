//! The controller's watches and what each change triggers: a change of a policy's inputs,
//! of its CRD (not its own patch coming back), or of a competing policy starts a reconcile;
//! a CA rotation reconciles every policy. Also the leader's background writers, which stop
//! with the controller however it stops.

pub mod triggers;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tracing::{error, info, warn};

use crate::api::VersionPolicy;
use crate::clock::Clock;
use crate::controller::jobs::BackgroundJobs;
use crate::controller::metrics::Metrics;
use crate::controller::process::http::Health;
use crate::controller::process::{RunError, RunSettings};
use crate::controller::traffic::TrafficMonitor;
use crate::controller::{Context, CrdsSeen, error_policy, reconcile};
use crate::supervise::{SupervisedTask, Supervisor};
use crate::webhook::ca::{CaBundleKeeper, WebhookEndpoint};

/// Stops the background jobs (migrations, cleanups, preflights) when the controller stops,
/// however it stops: also when its future is dropped because leadership was lost.
struct StopJobs(Arc<BackgroundJobs>);

impl Drop for StopJobs {
    fn drop(&mut self) {
        // Interrupted migrations resume from their checkpoints under the next leader.
        self.0.shutdown();
    }
}

/// The controller itself, without the process around it (metrics server, webhook, leader
/// election): watches, reconciles and background runs until `shutdown`. `clock` is the
/// instant its decisions use (the wall clock; tests give one of their own).
pub async fn controller(
    client: Client,
    settings: RunSettings,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    webhook: Option<Arc<WebhookEndpoint>>,
    clock: Clock,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), RunError> {
    let policies: Api<DeserializeGuard<VersionPolicy>> = Api::all(client.clone());
    // Metadata is enough to know which CRD changed (and costs far less than the schemas).
    let crds: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let (policies_listed, policy_changes) = policy_changes(policies.clone(), writer);
    let mut controller = Controller::for_stream(policy_changes, store.clone());
    // A new CA bundle (a CA rotation) reaches every CRD at once, not at the next resync.
    if let Some(endpoint) = &webhook {
        controller = controller.reconcile_all_on(bundle_changes(endpoint));
    }

    // A CRD event (including the migrator trimming status.storedVersions) reconciles the
    // policies that target it, except those whose last reconcile acted on the CRD at that
    // resourceVersion (its own patch coming back).
    let by_crd = store.clone();
    let last_reconciles = Arc::new(triggers::LastReconciles::default());
    let acted_on = last_reconciles.clone();
    // Each CRD's resourceVersion, whether the CRD watch is up (a kept CRD serves reads only
    // then), and deletions, before the events are mapped to reconciles.
    let crds_seen = Arc::new(CrdsSeen::default());
    let crd_changes = crd_changes(crds, crds_seen.clone());
    // A policy created, deleted or moved to another CRD reconciles the other policies for
    // the same CRD (the loser of a conflict takes over when the winner is deleted).
    let by_competitor = store.clone();
    let competitors = competitor_changes(policies);

    let recorder = Recorder::new(client.clone(), reporter(&settings));
    let (jobs, traffic, stop_jobs, leader_tasks) =
        background_writers(&client, &settings, &metrics, &recorder, &clock, &webhook);
    let context = Arc::new(
        Context::builder(client, store)
            .recorder(recorder)
            .metrics(metrics)
            .clock(clock)
            .resync(settings.resync)
            .jobs(jobs.clone())
            .traffic(traffic)
            .webhook(webhook)
            .last_reconciles(last_reconciles)
            .crds_seen(crds_seen)
            .build(),
    );
    let ready_when_listed = ready_when_listed(health, policies_listed);
    // When each kind of watch failure was last reported.
    let watch_errors = WatchErrors::default();
    info!("controller started");
    let running = controller
        .watches_stream(crd_changes, move |crd| {
            reconciled_on_crd_change(&by_crd, &acted_on, &crd)
        })
        .watches_stream(competitors, move |policy| competitors_of(&by_competitor, &policy))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(move |result| {
            log_result(result, &watch_errors);
            std::future::ready(())
        });
    let result = until_stopped(running, leader_tasks, ready_when_listed).await;
    drop(stop_jobs);
    info!("controller stopped");
    result
}

/// The policies' watch, which fills the cache (`writer`) with every change of a policy, and
/// the changes that start a reconcile: those of what a reconcile acts on
/// (`triggers::policy_inputs`), not its own status and finalizer writes. The `Listed` resolves
/// once the policies are listed (not `store.wait_until_ready()`: kube-runtime's `Controller`
/// waits on it, and it wakes one waiter only).
fn policy_changes(
    policies: Api<DeserializeGuard<VersionPolicy>>,
    writer: reflector::store::Writer<DeserializeGuard<VersionPolicy>>,
) -> (
    crate::sync::Listed,
    impl futures::Stream<Item = Result<DeserializeGuard<VersionPolicy>, watcher::Error>> + use<>,
) {
    let (policies_listed, policy_lists) = crate::sync::Listed::new();
    let changes = watcher(policies, watcher::Config::default().any_semantic())
        .reflect(writer)
        .inspect(policy_lists)
        .applied_objects()
        .predicate_filter(triggers::policy_inputs, Default::default());
    (policies_listed, changes)
}

/// A policy created, deleted or moved to another CRD (`triggers::competition`): the other
/// policies for the same CRD are reconciled (`competitors_of`).
fn competitor_changes(
    policies: Api<DeserializeGuard<VersionPolicy>>,
) -> impl futures::Stream<Item = Result<DeserializeGuard<VersionPolicy>, watcher::Error>> + use<> {
    watcher(policies, watcher::Config::default().any_semantic())
        .touched_objects()
        .predicate_filter(triggers::competition, Default::default())
}

/// Runs the controller (`running`) until it stops or one of the leader's own essential tasks
/// (`leader_tasks`: the traffic sampler, the CA bundle keeper) fails, which ends this term;
/// meanwhile readiness follows the policies' listing (`ready_when_listed`). The tasks are
/// aborted when this returns or is dropped.
async fn until_stopped(
    running: impl Future<Output = ()>,
    mut leader_tasks: Supervisor,
    ready_when_listed: impl Future<Output = ()>,
) -> Result<(), RunError> {
    tokio::select! {
        biased;
        failed = leader_tasks.first_failure() => Err(failed.into()),
        () = running => Ok(()),
        () = async { ready_when_listed.await; std::future::pending::<()>().await } => Ok(()),
    }
}

/// How long a leader that serves the conversion webhook stays ready (as the standby it was)
/// before it has listed the policies: a takeover lists them in milliseconds, and a replica
/// that flapped to not ready at every takeover would take its webhook out of the Service
/// while the old leader drains. A refused watch still shows within it.
pub(crate) const LIST_GRACE: Duration = Duration::from_secs(10);

/// Ready once the policies are listed: a controller whose watch is refused (no
/// VersionPolicy CRD, no permission) is not. A leader still ready when its term starts (one
/// serving the webhook, see `process::lead`) stays so for `LIST_GRACE`, then is not ready
/// until they are.
async fn ready_when_listed(health: Arc<Health>, policies_listed: crate::sync::Listed) {
    let listed = tokio::select! {
        listed = policies_listed.wait() => listed,
        () = tokio::time::sleep(LIST_GRACE) => {
            if health.ready.swap(false, Ordering::Relaxed) {
                warn!("VersionPolicies not listed within {LIST_GRACE:?} of taking the lead; not ready until they are");
            }
            policies_listed.wait().await
        }
    };
    if listed {
        health.ready.store(true, Ordering::Relaxed);
        info!("VersionPolicies listed; ready");
    }
}

/// The leader's writers besides the reconciles: the background jobs (migrations, cleanups,
/// preflights), stopped with the controller however it stops (`StopJobs`), and its own
/// essential tasks, the traffic sampler and the CA bundle keeper, aborted with their
/// `Supervisor` (`until_stopped`).
fn background_writers(
    client: &Client,
    settings: &RunSettings,
    metrics: &Arc<Metrics>,
    recorder: &Recorder,
    clock: &Clock,
    webhook: &Option<Arc<WebhookEndpoint>>,
) -> (Arc<BackgroundJobs>, Arc<TrafficMonitor>, StopJobs, Supervisor) {
    let jobs = Arc::new(
        BackgroundJobs::new(
            client.clone(),
            recorder.clone(),
            metrics.clone(),
            settings.parallel_migrations,
        )
        .with_svm_pending_deadline(settings.svm_pending_deadline)
        .with_clock(clock.clone()),
    );
    let traffic = TrafficMonitor::new(client.clone(), settings.traffic_sample_interval);
    let sampler = traffic.clone();
    let mut leader_tasks = Supervisor::default();
    leader_tasks.add(SupervisedTask::spawn("the traffic sampler", async move {
        sampler.run().await;
        Err("it returned".to_owned())
    }));
    // Every CRD pointed at the webhook trusts its CAs, governed or not.
    leader_tasks.extend(webhook.clone().map(|endpoint| {
        let keeper = CaBundleKeeper::new(client.clone(), endpoint, recorder.clone());
        SupervisedTask::spawn("the CA bundle keeper", async move {
            keeper.run().await;
            Err("it returned".to_owned())
        })
    }));
    (jobs.clone(), traffic, StopJobs(jobs), leader_tasks)
}

/// When each kind of watch failure was last reported.
type WatchErrors = Arc<std::sync::Mutex<std::collections::HashMap<String, tokio::time::Instant>>>;

/// Logs what one reconcile (or watch) of the controller's stream ended with: routine ends
/// at debug level, a watch that keeps failing once a minute.
fn log_result<T>(
    result: Result<
        T,
        kube::runtime::controller::Error<crate::controller::Error, kube::runtime::watcher::Error>,
    >,
    watch_errors: &WatchErrors,
) {
    match result {
        // A policy deleted between its event and its reconcile: routine.
        Err(error @ kube::runtime::controller::Error::ObjectNotFound(_)) => {
            tracing::debug!(error = %error, "policy gone before its reconcile");
        }
        // A watch resumed from a resourceVersion etcd compacted away answers
        // 410 Expired: routine, the watcher lists again.
        Err(kube::runtime::controller::Error::QueueError(kube::runtime::watcher::Error::WatchError(
            status,
        ))) if status.code == 410 => {
            tracing::debug!(error = %status.message, "a watch expired (410); listing again");
        }
        // A watch that keeps failing (no VersionPolicy CRD, no permission) is
        // retried with backoff; saying so once a minute is enough.
        Err(kube::runtime::controller::Error::QueueError(error)) => {
            let hint = watch_failure_hint(&error);
            let mut last = crate::sync::lock(watch_errors);
            let due = last
                .get(&hint)
                .is_none_or(|at: &tokio::time::Instant| at.elapsed() >= WATCH_ERROR_EVERY);
            if due {
                last.insert(hint.clone(), tokio::time::Instant::now());
                error!(error = %error, "{hint}");
            }
        }
        Err(error) => warn!(error = %error, "controller error"),
        Ok(_) => {}
    }
}

/// The CRDs' changes (metadata only), recorded in `crds_seen` before they are mapped to
/// reconciles.
fn crd_changes(
    crds: Api<PartialObjectMeta<CustomResourceDefinition>>,
    crds_seen: Arc<CrdsSeen>,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<CustomResourceDefinition>, watcher::Error>> {
    watcher(crds, watcher::Config::default().any_semantic())
        .inspect(move |event| crds_seen.watch_event(event))
        .touched_objects()
}

/// How often a watch that keeps failing is reported.
const WATCH_ERROR_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// What a failing watch means for the person reading the log.
fn watch_failure_hint(error: &kube::runtime::watcher::Error) -> String {
    let text = error.to_string();
    if text.contains("404") || text.to_lowercase().contains("not found") {
        "cannot watch VersionPolicies: the VersionPolicy CRD is not installed (kubectl apply -f crds/versionpolicy.yaml); retrying, not ready".to_owned()
    } else if text.contains("403") || text.to_lowercase().contains("forbidden") {
        "cannot watch VersionPolicies or CustomResourceDefinitions: permission denied (apply deploy/rbac.yaml, or `kubectl auth can-i list versionpolicies.crdlifecycle.io`); retrying, not ready".to_owned()
    } else {
        "a watch of VersionPolicies or CustomResourceDefinitions keeps failing; retrying, not ready"
            .to_owned()
    }
}

/// The events' reporter: this controller, as this replica.
fn reporter(settings: &RunSettings) -> Reporter {
    Reporter {
        controller: "crd-lifecycle".into(),
        instance: Some(settings.identity.clone()),
    }
}

/// Each new CA bundle of the webhook (a CA rotation), as a stream of triggers.
fn bundle_changes(endpoint: &WebhookEndpoint) -> impl futures::Stream<Item = ()> + use<> {
    futures::stream::unfold(endpoint.bundle_changes(), |mut changes| async move {
        changes.changed().await.ok()?;
        Some(((), changes))
    })
}

/// The policies a change of `crd` reconciles: those that target it, except those whose
/// last reconcile acted on the CRD at that resourceVersion (their own patch coming back).
fn reconciled_on_crd_change(
    store: &Store<DeserializeGuard<VersionPolicy>>,
    last_reconciles: &triggers::LastReconciles,
    crd: &PartialObjectMeta<CustomResourceDefinition>,
) -> Vec<ObjectRef<DeserializeGuard<VersionPolicy>>> {
    let resource_version = crd.resource_version().unwrap_or_default();
    let mut policies = policies_for_crd(store, &crd.name_any(), None);
    policies.retain(|policy| !last_reconciles.acted_on(&policy.name, &resource_version));
    policies
}

/// The other policies for the same CRD as `policy` (created, deleted or moved to another
/// CRD): the loser of a conflict takes over when the winner is deleted.
fn competitors_of(
    store: &Store<DeserializeGuard<VersionPolicy>>,
    policy: &DeserializeGuard<VersionPolicy>,
) -> Vec<ObjectRef<DeserializeGuard<VersionPolicy>>> {
    let crd_name = policy
        .0
        .as_ref()
        .map(|p| p.spec.crd_name.clone())
        .unwrap_or_default();
    policies_for_crd(store, &crd_name, Some(&policy.name_any()))
}

/// The policies in the cache that target `crd_name`, except `except`.
fn policies_for_crd(
    store: &Store<DeserializeGuard<VersionPolicy>>,
    crd_name: &str,
    except: Option<&str>,
) -> Vec<ObjectRef<DeserializeGuard<VersionPolicy>>> {
    store
        .state()
        .iter()
        .filter(|guard| guard.0.as_ref().is_ok_and(|p| p.spec.crd_name == crd_name))
        .filter(|guard| Some(guard.name_any().as_str()) != except)
        .map(|guard| ObjectRef::from_obj(guard.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed() -> Result<kube::runtime::watcher::Event<VersionPolicy>, watcher::Error> {
        Ok(kube::runtime::watcher::Event::InitDone)
    }

    /// A standby that takes the lead stays ready (its webhook in the Service) while it lists;
    /// one whose list does not come within the grace is not ready until it does.
    #[tokio::test(start_paused = true)]
    async fn a_new_leader_stays_ready_for_the_grace_then_not_until_it_has_listed() {
        let health = Arc::new(Health::default());
        health.ready.store(true, Ordering::Relaxed);
        let (policies_listed, inspect) = crate::sync::Listed::new::<VersionPolicy>();
        let task = tokio::spawn(ready_when_listed(health.clone(), policies_listed));
        tokio::time::sleep(LIST_GRACE - Duration::from_millis(1)).await;
        assert!(health.ready.load(Ordering::Relaxed), "ready within the grace");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(
            !health.ready.load(Ordering::Relaxed),
            "not ready past the grace, unlisted"
        );
        inspect(&listed());
        task.await.expect("ends once listed");
        assert!(health.ready.load(Ordering::Relaxed), "ready once listed");
    }

    /// A replica that starts is not ready until its policies are listed, grace or not.
    #[tokio::test(start_paused = true)]
    async fn a_starting_replica_is_ready_only_once_listed() {
        let health = Arc::new(Health::default());
        let (policies_listed, inspect) = crate::sync::Listed::new::<VersionPolicy>();
        let task = tokio::spawn(ready_when_listed(health.clone(), policies_listed));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!health.ready.load(Ordering::Relaxed));
        inspect(&listed());
        task.await.expect("ends once listed");
        assert!(health.ready.load(Ordering::Relaxed));
    }
}
