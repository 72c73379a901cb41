//! The controller's background jobs, under one runner: migrations after a `store` (the
//! internal engine, or a StorageVersionMigration followed), managedFields cleanups before a
//! removal, and conversion preflights ahead of a `store`. One task per key (`goal`), a
//! bounded number reading at once, independent of reconciles, with progress checkpointed in
//! the policy's status so that a restarted controller resumes where it stopped.
//!
//! - this file: the runner (`BackgroundJobs`): starting a run unless it is under way,
//!   aborting one towards another goal, stopping them all;
//! - `goal`: which run is which, and what it works towards (pure);
//! - `migrator_job`: what a run of the migrator does and what its last run says about the next (pure);
//! - `migration`: the internal migrator's runs (a migration or a managedFields cleanup);
//! - `progress`: a running job's counts and checkpoint, written while it runs;
//! - `end`: how a run ends: its status, Event and metrics;
//! - `builtin`: the built-in engine (StorageVersionMigrations created, followed, and what
//!   their failures hold);
//! - `preflight`: conversion preflights and their check before the store;
//! - `permissions`: whether the controller may run a job (cached), and when to ask again;
//! - `object_count`: each CRD's object count, for the preflight's lead.

mod builtin;
mod end;
mod goal;
mod migration;
mod migrator_job;
mod object_count;
pub(crate) mod permissions;
pub mod preflight;
mod progress;

pub use builtin::ENABLE_HINT as BUILTIN_MIGRATION_ENABLE_HINT;
pub use goal::RunningMigration;

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use crate::controller::events::{EventReason, event};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::Recorder;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::metrics::Metrics;
use crate::api::VersionPolicy;
use crate::kube_events;
use crate::migrate;
use goal::{Goal, JobKey};
use preflight::RememberedObjects;

/// Field manager of `status.migration`, separate from the reconciler's so that the two
/// server-side applies never take each other's fields.
pub const MIGRATION_FIELD_MANAGER: &str = "crd-lifecycle-migrator";

/// Field manager of the former single `status.preflight` (earlier releases), and the prefix
/// of the field managers of `status.preflights` (one per version,
/// `preflight::run::preflight_manager`).
const PREFLIGHT_FIELD_MANAGER: &str = "crd-lifecycle-preflight";

/// Field manager of `status.managedFieldsCleanup`.
const CLEANUP_FIELD_MANAGER: &str = "crd-lifecycle-managed-fields";

/// How long after a failed run a new one may start.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(300);

/// How long a StorageVersionMigration may stay Pending (not picked up by the svm
/// controller) before its run fails.
const SVM_PENDING_DEADLINE: Duration = Duration::from_secs(600);

/// How often a running migration writes its progress.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

/// A run under way in this process.
struct Running {
    /// What the run works towards.
    goal: Goal,
    handle: JoinHandle<()>,
}

/// The background jobs of one controller.
///
/// What a run decides from (what ran, towards what, its result and when it ended) lives in
/// the policy's status (`status.migration`, `status.managedFieldsCleanup`,
/// `status.preflights`), read again from the apiserver when a run starts, so that a
/// restarted controller or a new leader decides the same. The maps here are this process's
/// own: its tasks, and caches whose loss costs requests, never a decision.
pub struct BackgroundJobs {
    client: Client,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    slots: Arc<Semaphore>,
    /// The runs under way in this process (by key), to tell whether one runs and to abort
    /// one towards another goal.
    running: Mutex<HashMap<JobKey, Running>>,
    /// Cache: when each permission check (by CRD and run kind) last found everything
    /// allowed (`PERMITTED_FOR`); a new leader asks again.
    permitted_at: Mutex<HashMap<String, Instant>>,
    progress_interval: Duration,
    retry: migrate::RetryPolicy,
    settle: migrate::SettleCheck,
    retry_after_failure: Duration,
    /// Pacing only: how often in a row each policy (by name) was found missing a permission,
    /// for the backoff of the next check (a new leader starts again at the first step).
    missing_checks: Mutex<HashMap<String, u32>>,
    /// Cache: whether the built-in migrator's API is served, and when that was asked (an
    /// async lock, held while it is asked).
    builtin_api: tokio::sync::Mutex<Option<(Instant, Option<migrate::builtin::Migrations>)>>,
    /// How long a StorageVersionMigration may stay Pending before its run fails.
    svm_pending_deadline: Duration,
    /// Cache: each CRD's object count (for a preflight's lead), and when it was counted.
    object_counts: Mutex<HashMap<String, (Instant, Option<u64>)>>,
    /// Cache of what status cannot hold (bounded as it is not): the objects each passed
    /// preflight (by key) read, so that the check before its store reads only those changed
    /// since. Kept only for stores still to come; a controller without it compares the
    /// objects' digest (`status.preflights[].objectsDigest`) instead.
    checked_objects: Mutex<HashMap<JobKey, RememberedObjects>>,
    /// The controller's clock, for the instants runs record (compared with the schedule's
    /// and with each other's).
    clock: crate::clock::Clock,
}

impl BackgroundJobs {
    /// At most `parallel` migrations run at once; the others wait for a slot.
    pub fn new(client: Client, recorder: Recorder, metrics: Arc<Metrics>, parallel: usize) -> Self {
        Self {
            client,
            recorder,
            metrics,
            slots: Arc::new(Semaphore::new(parallel.max(1))),
            running: Mutex::new(HashMap::new()),
            permitted_at: Mutex::new(HashMap::new()),
            progress_interval: PROGRESS_INTERVAL,
            retry: migrate::RetryPolicy::default(),
            settle: migrate::SettleCheck::default(),
            retry_after_failure: RETRY_AFTER_FAILURE,
            builtin_api: tokio::sync::Mutex::new(None),
            svm_pending_deadline: SVM_PENDING_DEADLINE,
            object_counts: Mutex::new(HashMap::new()),
            checked_objects: Mutex::new(HashMap::new()),
            clock: Arc::new(Timestamp::now),
            missing_checks: Mutex::new(HashMap::new()),
        }
    }

    /// How long after a failed run (or preflight) a new one may start (default 5 min).
    pub fn with_retry_after_failure(mut self, wait: Duration) -> Self {
        self.retry_after_failure = wait;
        self
    }

    /// How requests that may succeed later are retried (default: 6 attempts, 0.2 s
    /// doubling to 30 s).
    pub fn with_retry(mut self, retry: migrate::RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The clock preflights record their instants by (the controller's).
    pub fn with_clock(mut self, clock: crate::clock::Clock) -> Self {
        self.clock = clock;
        self
    }

    fn now(&self) -> Timestamp {
        (self.clock)()
    }

    /// How a storage switch (or a newly served version) is confirmed through discovery
    /// before a run (default: 5 answers in a row, 1 s apart, for up to 5 minutes).
    pub fn with_settle_check(mut self, settle: migrate::SettleCheck) -> Self {
        self.settle = settle;
        self
    }

    /// How long a StorageVersionMigration may stay Pending (the svm controller not picking
    /// it up) before its run fails and the policy is Stalled (default 10 minutes).
    pub fn with_svm_pending_deadline(mut self, deadline: Duration) -> Self {
        self.svm_pending_deadline = deadline;
        self
    }

    /// How often a running migration writes its progress (default 2 s).
    pub fn with_progress_interval(mut self, interval: Duration) -> Self {
        self.progress_interval = interval;
        self
    }

    /// What the migration of this CRD under way works towards (into which storage version,
    /// with which engine).
    fn running_goal(&self, crd: &str) -> Option<Goal> {
        lock(&self.running)
            .get(&JobKey::Migration { crd: crd.to_owned() })
            .filter(|r| !r.handle.is_finished())
            .map(|r| r.goal.clone())
    }

    /// This controller's migration of the CRD under way, if any: what a gate that waits for
    /// it says it waits for ("... has finished").
    pub(crate) fn running_migration(&self, crd: &str) -> Option<RunningMigration> {
        RunningMigration::of(self.running_goal(crd)?)
    }

    /// The policy as the apiserver has it now (a task about to start decides on it: the
    /// cache may lag behind this controller's own status writes); `cached` when it cannot
    /// be read.
    async fn fresh(&self, cached: VersionPolicy) -> VersionPolicy {
        let name = cached.metadata.name.clone().unwrap_or_default();
        match super::status::read_policy(&self.client, &name).await {
            Ok(Some(fresh)) => fresh,
            Ok(None) => cached,
            Err(error) => {
                warn!(policy = name, error = %error, "cannot read the policy; deciding on the cached one");
                cached
            }
        }
    }

    /// Runs `task` as the run of `crd` towards `goal` (under `goal`'s key), unless that run
    /// is under way (`true`) or `held` (`false`). A run towards another goal can only end in
    /// a restart: it is aborted.
    fn launch(
        &self,
        crd: &str,
        goal: Goal,
        held: bool,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> bool {
        let key = goal.key(crd);
        let mut running = lock(&self.running);
        if let Some(current) = running.get(&key)
            && !current.handle.is_finished()
        {
            if current.goal == goal {
                return true;
            }
            current.handle.abort();
        }
        if held {
            return false;
        }
        let handle = tokio::spawn(task);
        running.insert(key, Running { goal, handle });
        true
    }

    /// Stops every migration (on shutdown); their checkpoints let the next leader resume.
    pub fn shutdown(&self) {
        for (key, running) in lock(&self.running).drain() {
            info!(run = %key, "stopping a background run");
            running.handle.abort();
        }
        // Aborted runs cannot forget their gauges themselves.
        self.metrics.objects_remaining.clear();
        self.metrics.job_objects_done.clear();
        self.metrics.job_objects_expected.clear();
        self.metrics.job_objects_per_second.clear();
    }

    async fn event(&self, reference: &ObjectReference, reason: EventReason, note: String) {
        kube_events::send(&self.recorder, reference, event(reason, note, "Migrate")).await;
    }
}
