//! Storage-version migrations run by the controller: one background task per CRD (a
//! bounded number at once), independent of reconciles, with progress checkpointed in the
//! policy's `status.migration` so that a restarted controller resumes where it stopped.

mod builtin;
mod job;
pub mod permissions;
pub mod preflight;
mod progress;

pub use builtin::ENABLE_HINT as BUILTIN_MIGRATION_ENABLE_HINT;

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, Resource};
use prometheus_client::metrics::counter::Counter;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::metrics::{CrdLabels, JobLabels, Metrics, MigrationResultLabels};
use super::status::apply_status;
use crate::api::{MigrationPhase, MigrationStatus, VersionPolicy};
use crate::kube_events;
use crate::migrate::{self, Counts, Mode, Outcome, Report};
use job::Job;
use progress::{AbortOnDrop, TaskProgress, apply_counts, checkpoint_status};

/// Field manager of `status.migration`, separate from the reconciler's so that the two
/// server-side applies never take each other's fields.
pub const MIGRATION_FIELD_MANAGER: &str = "crd-lifecycle-migrator";

/// Field manager of the former single `status.preflight` (earlier releases), and the prefix
/// of the field managers of `status.preflights` (one per version,
/// `preflight::preflight_manager`).
pub const PREFLIGHT_FIELD_MANAGER: &str = "crd-lifecycle-preflight";

/// Field manager of `status.managedFieldsCleanup`.
pub const CLEANUP_FIELD_MANAGER: &str = "crd-lifecycle-managed-fields";

/// How long after a failed run a new one may start.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(300);

/// How long a CRD's object count stands for the lead of its preflights.
const OBJECT_COUNT_FOR: Duration = Duration::from_secs(600);

/// How often a run that could not trim because the CRD changed meanwhile is repeated at
/// once.
const MAX_RERUNS: usize = 5;

/// How long a StorageVersionMigration may stay Pending (not picked up by the svm
/// controller) before its run fails.
pub const SVM_PENDING_DEADLINE: Duration = Duration::from_secs(600);

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunEnd {
    /// Every object done (and, for a migration, storedVersions trimmed).
    Succeeded,
    /// Objects failed, or the trim could not be made.
    Failed,
    /// The run stopped before it could report per object.
    Error,
    /// The run's own access check found a grant missing (revoked since the controller's
    /// cached check said allowed).
    MissingPermission,
}

impl RunEnd {
    const ALL: [RunEnd; 4] = [
        RunEnd::Succeeded,
        RunEnd::Failed,
        RunEnd::Error,
        RunEnd::MissingPermission,
    ];

    /// Its `result` label value.
    fn label(self) -> &'static str {
        match self {
            RunEnd::Succeeded => "succeeded",
            RunEnd::Failed => "failed",
            RunEnd::Error => "error",
            RunEnd::MissingPermission => "missing_permission",
        }
    }
}

/// The window over which a running job's rate is measured.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// How often a running migration writes its progress.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

pub(super) struct Running {
    /// What the run works towards: the storage version (and, for a cleanup, its versions).
    pub(super) goal: String,
    pub(super) handle: JoinHandle<()>,
}

/// The objects a passed preflight read (`migrate::CheckedObjects`), and the result they
/// belong to (its objects digest and fingerprint, as in its status).
pub(super) struct RememberedObjects {
    pub(super) digest: String,
    pub(super) fingerprint: String,
    pub(super) objects: Arc<migrate::CheckedObjects>,
}

/// The migrations of one controller.
///
/// What a run decides from (what ran, towards what, its result and when it ended) lives in
/// the policy's status (`status.migration`, `status.managedFieldsCleanup`,
/// `status.preflights`), read again from the apiserver when a run starts, so that a
/// restarted controller or a new leader decides the same. The maps here are this process's
/// own: its tasks, and caches whose loss costs requests, never a decision.
pub struct BackgroundJobs {
    pub(super) client: Client,
    pub(super) recorder: Recorder,
    pub(super) metrics: Arc<Metrics>,
    pub(super) slots: Arc<Semaphore>,
    /// The runs under way in this process (by key), to tell whether one runs and to abort
    /// one towards another goal.
    pub(super) running: Mutex<HashMap<String, Running>>,
    /// Cache: when each permission check (by CRD and run kind) last found everything
    /// allowed (`PERMITTED_FOR`); a new leader asks again.
    pub(super) permitted_at: Mutex<HashMap<String, Instant>>,
    pub(super) progress_interval: Duration,
    pub(super) retry: migrate::RetryPolicy,
    pub(super) settle: migrate::SettleCheck,
    pub(super) retry_after_failure: Duration,
    /// Pacing only: how often in a row each policy (by name) was found missing a permission,
    /// for the backoff of the next check (a new leader starts again at the first step).
    pub(super) missing_checks: Mutex<HashMap<String, u32>>,
    /// Cache: whether the built-in migrator's API is served, and when that was asked (an
    /// async lock, held while it is asked).
    pub(super) builtin_api: tokio::sync::Mutex<Option<(Instant, Option<migrate::builtin::Migrations>)>>,
    /// How long a StorageVersionMigration may stay Pending before its run fails.
    pub(super) svm_pending_deadline: Duration,
    /// Cache: each CRD's object count (for a preflight's lead), and when it was counted.
    pub(super) object_counts: Mutex<HashMap<String, (Instant, Option<u64>)>>,
    /// Cache of what status cannot hold (bounded as it is not): the objects each passed
    /// preflight (by key) read, so that the check before its store reads only those changed
    /// since. Kept only for stores still to come; a controller without it compares the
    /// objects' digest (`status.preflights[].objectsDigest`) instead.
    pub(super) checked_objects: Mutex<HashMap<String, RememberedObjects>>,
    /// The controller's clock, for the instants runs record (compared with the schedule's
    /// and with each other's).
    pub(super) clock: crate::clock::Clock,
}

/// This controller's migration of a CRD under way (`BackgroundJobs::running_migration`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningMigration {
    pub storage_version: String,
    /// It follows a StorageVersionMigration of its own (the built-in engine); it settles for
    /// seconds before it creates it, and checks the storage guard after Kubernetes trims.
    pub builtin: bool,
}

impl RunningMigration {
    /// What a gate waiting for it waits for.
    pub fn awaited(&self, crd: &str) -> String {
        let what = if self.builtin {
            "StorageVersionMigration"
        } else {
            "migration"
        };
        format!(
            "this controller's {what} of {crd} into {} has finished",
            self.storage_version
        )
    }
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

    /// How a storage switch (or a newly served version) is confirmed through discovery
    /// before a run (default: 5 answers in a row, 1 s apart, for up to 5 minutes).
    /// The clock preflights record their instants by (the controller's).
    pub fn with_clock(mut self, clock: crate::clock::Clock) -> Self {
        self.clock = clock;
        self
    }

    pub(super) fn now(&self) -> Timestamp {
        (self.clock)()
    }

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

    /// What the migration of this CRD under way works towards (`v1`, or `builtin v1` for
    /// a followed StorageVersionMigration).
    pub fn running_goal(&self, crd: &str) -> Option<String> {
        lock(&self.running)
            .get(crd)
            .filter(|r| !r.handle.is_finished())
            .map(|r| r.goal.clone())
    }

    /// This controller's migration of the CRD under way, if any: what a gate that waits for
    /// it says it waits for ("... has finished").
    pub fn running_migration(&self, crd: &str) -> Option<RunningMigration> {
        let goal = self.running_goal(crd)?;
        Some(match goal.strip_prefix("builtin ") {
            Some(storage) => RunningMigration {
                storage_version: storage.to_owned(),
                builtin: true,
            },
            None => RunningMigration {
                storage_version: goal,
                builtin: false,
            },
        })
    }

    /// Whether a migration of this CRD is under way.
    pub fn is_running(&self, crd: &str) -> bool {
        lock(&self.running)
            .get(crd)
            .is_some_and(|r| !r.handle.is_finished())
    }

    /// Starts migrating the policy's CRD into `storage_version` unless that already runs
    /// or the last run failed recently. Returns whether a migration is running now.
    pub fn ensure(self: &Arc<Self>, policy: &VersionPolicy, storage_version: &str) -> bool {
        self.start(policy, storage_version, Job::Migrate, None)
    }

    /// Starts rewriting the managedFields entries that name `versions` (versions whose
    /// removal is due) into the storage version, unless that already runs or failed
    /// recently; the result goes to `status.managedFieldsCleanup`.
    /// Returns whether a cleanup is under way now.
    /// `crd_generation`: the CRD's generation now; a cleanup that succeeded at another
    /// one does not count (`decide::managed_fields_pending`). `gone`: the versions its status
    /// records as cleaned while gone from the CRD (`MigrationStatus::gone_versions`).
    pub fn ensure_cleanup(
        self: &Arc<Self>,
        policy: &VersionPolicy,
        storage_version: &str,
        versions: Vec<String>,
        gone: Vec<String>,
        crd_generation: Option<i64>,
    ) -> bool {
        self.start(
            policy,
            storage_version,
            Job::CleanManagedFields { versions, gone },
            crd_generation,
        )
    }

    /// Starts `job` for the policy's CRD towards `storage_version` unless the same run is
    /// under way (a run towards another goal can only end in a restart: it is aborted) or
    /// the last one failed recently (by the policy's status). Returns whether a run is under
    /// way now.
    fn start(
        self: &Arc<Self>,
        policy: &VersionPolicy,
        storage_version: &str,
        job: Job,
        crd_generation: Option<i64>,
    ) -> bool {
        let key = job.key(&policy.spec.crd_name);
        let goal = job.goal(storage_version);
        let held = self.failed_recently(&job, policy, storage_version);
        let this = self.clone();
        let policy = policy.clone();
        let storage = storage_version.to_owned();
        self.launch(key, goal, held, async move {
            this.run(policy, storage, job, crd_generation).await
        })
    }

    /// Whether the last run of `job` towards `storage_version` failed less than
    /// `retry_after_failure` ago, by the policy's status (`phase` and `finishedAt`, on this
    /// controller's clock): a new leader holds it back as long as the old one would have.
    fn failed_recently(&self, job: &Job, policy: &VersionPolicy, storage_version: &str) -> bool {
        let wait =
            jiff::SignedDuration::try_from(self.retry_after_failure).unwrap_or(jiff::SignedDuration::MAX);
        job.previous(policy).is_some_and(|previous| {
            previous.phase == MigrationPhase::Failed
                && previous.storage_version == storage_version
                && previous.versions == job.versions()
                && previous
                    .finished_at
                    .is_some_and(|at| self.now().duration_since(at.0) < wait)
        })
    }

    /// Whether a cleanup like `job` towards `storage_version` already succeeded at the CRD's
    /// generation `crd_generation`, by the policy's status.
    fn cleaned(
        job: &Job,
        policy: &VersionPolicy,
        storage_version: &str,
        crd_generation: Option<i64>,
    ) -> bool {
        matches!(job, Job::CleanManagedFields { .. })
            && job.previous(policy).is_some_and(|previous| {
                previous.succeeded_at(crd_generation)
                    && previous.storage_version == storage_version
                    && job.versions().iter().all(|v| previous.versions.contains(v))
            })
    }

    /// The policy as the apiserver has it now (a task about to start decides on it: the
    /// cache may lag behind this controller's own status writes); `cached` when it cannot
    /// be read.
    pub(super) async fn fresh(&self, cached: VersionPolicy) -> VersionPolicy {
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

    /// Runs `task` as the run of `key` towards `goal`, unless that run is under way (`true`)
    /// or `held` (`false`). A run towards another goal can only end in a restart: it is
    /// aborted.
    pub(super) fn launch(
        &self,
        key: String,
        goal: String,
        held: bool,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> bool {
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

    /// How many objects the policy's CRD has: counted at most every `OBJECT_COUNT_FOR`
    /// (one list of a single object); `None` when it cannot be told.
    pub async fn object_count(&self, policy: &VersionPolicy) -> Option<u64> {
        let crd = &policy.spec.crd_name;
        if let Some((at, count)) = lock(&self.object_counts).get(crd)
            && at.elapsed() < OBJECT_COUNT_FOR
        {
            return *count;
        }
        let settings = migrate::Settings {
            retry: self.retry.clone(),
            ..migrate::Settings::default()
        };
        let count = match migrate::count_objects(&self.client, crd, &settings).await {
            Ok(count) => count,
            Err(error) => {
                warn!(crd, error = %error, "cannot count the objects for the preflight's lead");
                None
            }
        };
        let mut counts = lock(&self.object_counts);
        // Counts of CRDs no store is near any more go with the next count.
        counts.retain(|_, (at, _)| at.elapsed() < OBJECT_COUNT_FOR);
        counts.insert(crd.clone(), (Instant::now(), count));
        count
    }

    /// Stops every migration (on shutdown); their checkpoints let the next leader resume.
    pub fn shutdown(&self) {
        for (crd, running) in lock(&self.running).drain() {
            info!(crd, "stopping migration");
            running.handle.abort();
        }
        // Aborted runs cannot forget their gauges themselves.
        self.metrics.objects_remaining.clear();
        self.metrics.job_objects_done.clear();
        self.metrics.job_objects_expected.clear();
        self.metrics.job_objects_per_second.clear();
    }

    async fn run(
        self: Arc<Self>,
        policy: VersionPolicy,
        storage_version: String,
        job: Job,
        crd_generation: Option<i64>,
    ) {
        // Decided again on the status as it is (a run that failed or a cleanup that
        // succeeded moments ago may not show in the cache yet), and resumed from its
        // latest checkpoint.
        let policy = self.fresh(policy).await;
        if self.failed_recently(&job, &policy, &storage_version)
            || Self::cleaned(&job, &policy, &storage_version, crd_generation)
        {
            return;
        }
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let crd = policy.spec.crd_name.clone();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let reference = policy.object_ref(&());
        let settings = &policy.spec.migration;
        let previous = job.previous(&policy);
        let resume = job.resume_from(previous.as_ref(), &storage_version);
        let started_at = match &resume {
            Some(_) => previous
                .as_ref()
                .and_then(|m| m.started_at.clone())
                .unwrap_or(Time(self.now())),
            None => Time(self.now()),
        };
        // Read before the run lists its first object (a resumed run keeps what its start
        // read): the failed migrations this run covers if it rewrites every object.
        let (covers_failed_migrations, covers_failed_migration_on_crd) = match (&job, &resume) {
            (Job::Migrate, Some(_)) => previous.as_ref().map_or_else(Default::default, |run| {
                (
                    run.covers_failed_migrations.clone(),
                    run.covers_failed_migration_on_crd.clone(),
                )
            }),
            (Job::Migrate, None) => self.processed_failures(&crd).await,
            (Job::CleanManagedFields { .. }, _) => Default::default(),
        };
        let mut status = MigrationStatus {
            versions: job.versions(),
            gone_versions: job.gone(),
            crd_generation: resume.as_ref().and_then(|r| r.crd_generation),
            covers_failed_migrations,
            covers_failed_migration_on_crd,
            ..MigrationStatus::running(&storage_version, started_at)
        };
        let what = match &job {
            Job::Migrate => format!("the migration of {crd} to {storage_version}"),
            Job::CleanManagedFields { versions, .. } => format!(
                "the rewrite of {crd}'s managedFields entries naming {} into {storage_version}",
                versions.join(", ")
            ),
        };
        status.message = Some(format!("running {what}"));
        if let Some(resume) = &resume {
            apply_counts(&mut status, &resume.counts, None);
            status.checkpoint = Some(checkpoint_status(resume));
        }
        let note = match &resume {
            Some(resume) => format!("resuming {what} after {} objects", resume.counts.done()),
            None => format!("starting {what}"),
        };
        info!(crd, storage = storage_version, "{note}");
        let reason = job.reason(if resume.is_some() { "Resumed" } else { "Started" });
        self.event(&reference, EventType::Normal, &reason, note).await;
        self.write(&name, &job, &status).await;

        let migrate_settings = migrate::Settings {
            concurrency: usize::try_from(settings.concurrency).unwrap_or(16),
            page_size: settings.page_size,
            qps: settings.qps,
            mode: match job {
                Job::Migrate => Mode::Rewrite,
                Job::CleanManagedFields { .. } => Mode::CleanManagedFields,
            },
            managed_fields: migrate::ManagedFieldsCleanup {
                versions: Some(job.versions()),
                conversion: policy.spec.conversion.clone(),
                dry_run: false,
            },
            through_status: settings.subresource == Some(crate::api::RewriteSubresource::Status),
            resume,
            retry: self.retry.clone(),
            settle: self.settle.clone(),
            ..migrate::Settings::default()
        };
        let labels = CrdLabels { crd: crd.clone() };
        let job_labels = JobLabels {
            crd: crd.clone(),
            job: job.label().to_owned(),
        };
        self.initialize_counters(&job, &crd);
        let progress = Arc::new(TaskProgress {
            metrics: self.metrics.clone(),
            done_counter: match job {
                Job::Migrate => self.metrics.objects_migrated.clone(),
                Job::CleanManagedFields { .. } => self.metrics.objects_repaired.clone(),
            },
            labels: labels.clone(),
            job_labels: job_labels.clone(),
            rate: Mutex::new(migrate::Rate::new(RATE_WINDOW)),
            live: Mutex::new((Counts::default(), None)),
            target: Mutex::new(None),
            committed: Mutex::new(None),
            migrated: Mutex::new(
                migrate_settings
                    .resume
                    .as_ref()
                    .map_or(0, |r| r.counts.rewritten + r.counts.skipped),
            ),
        });
        // Aborted when this run ends, and also when the run itself is aborted (shutdown).
        let reporter = AbortOnDrop(self.clone().report_progress(
            name.clone(),
            job.clone(),
            status.clone(),
            progress.clone(),
        ));
        let started = Instant::now();
        let mut result = migrate::migrate(&self.client, &crd, &migrate_settings, progress.as_ref()).await;
        // A conversion change during a run forbids the trim (objects rewritten before it
        // went through the old one): run again at once, with nothing to resume (bounded).
        // Other CRD changes, such as the controller's own next transition, do not.
        let fresh = migrate::Settings {
            resume: None,
            ..migrate_settings.clone()
        };
        for _ in 0..MAX_RERUNS {
            let Ok(report) = &result else { break };
            let Outcome::NotTrimmed { reason } = &report.outcome else {
                break;
            };
            info!(crd, "{reason}; running the migration again");
            *lock(&progress.migrated) = 0;
            result = migrate::migrate(&self.client, &crd, &fresh, progress.as_ref()).await;
        }
        drop(reporter);

        // Each job forgets only its own series (a cleanup ending leaves a migration's).
        self.metrics.forget_job(&job_labels);
        self.metrics
            .migration_duration
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(report) => self.finish(&name, &reference, &job, status, &report).await,
            Err(migrate::Error::MissingPermission(message)) => {
                // The cached "allowed" no longer holds: forget it, so that the next
                // reconcile asks again and blocks with MissingPermission.
                warn!(crd, "{what} cannot start: {message}");
                self.forget_permissions(&crd);
                status.message = Some(message);
                self.conclude(&name, &reference, &job, &crd, status, RunEnd::MissingPermission)
                    .await;
            }
            Err(error) => {
                warn!(crd, error = %error, "{what} failed");
                status.message = Some(error.to_string());
                self.conclude(&name, &reference, &job, &crd, status, RunEnd::Error)
                    .await;
            }
        }
    }

    async fn finish(
        &self,
        name: &str,
        reference: &ObjectReference,
        job: &Job,
        mut status: MigrationStatus,
        report: &Report,
    ) {
        let crd = &report.target.crd;
        // Every object listed is accounted for once a run ends.
        status.total = Some(report.counts.listed);
        apply_counts(&mut status, &report.counts, None);
        status.crd_generation = report.target.generation;
        status.storage_version = report.target.storage_version.clone();
        status.checkpoint = None;
        status.failures = report.failures.iter().map(ToString::to_string).collect();
        status.message = Some(report.summary());
        // A run that found storedVersions trimmed already decided that from the CRD alone.
        status.rewrote_all = matches!(report.outcome, migrate::Outcome::Trimmed { .. });
        let labels = CrdLabels { crd: crd.clone() };
        self.metrics
            .objects_failed
            .get_or_create(&labels)
            .inc_by(report.counts.failed);
        let end = if report.succeeded() {
            RunEnd::Succeeded
        } else {
            RunEnd::Failed
        };
        self.conclude(name, reference, job, crd, status, end).await;
    }

    /// Records how a run ended: its status (phase, end time and `status.message`: a failure
    /// holds the next run back for `retry_after_failure`), the event and the result counter.
    async fn conclude(
        &self,
        name: &str,
        reference: &ObjectReference,
        job: &Job,
        crd: &str,
        mut status: MigrationStatus,
        end: RunEnd,
    ) {
        let message = status.message.clone().unwrap_or_default();
        let succeeded = end == RunEnd::Succeeded;
        match end {
            RunEnd::Succeeded => info!(crd, "{message}"),
            RunEnd::Failed => warn!(crd, "{message}"),
            // Logged where the error is at hand.
            RunEnd::Error | RunEnd::MissingPermission => {}
        }
        status.phase = if succeeded {
            MigrationPhase::Succeeded
        } else {
            MigrationPhase::Failed
        };
        status.finished_at = Some(Time(self.now()));
        self.write(name, job, &status).await;
        let (type_, reason) = match end {
            RunEnd::Succeeded => (EventType::Normal, job.reason("Succeeded")),
            RunEnd::MissingPermission => (EventType::Warning, "MissingPermission".to_owned()),
            RunEnd::Failed | RunEnd::Error => (EventType::Warning, job.reason("Failed")),
        };
        self.event(reference, type_, &reason, message).await;
        self.record_result(job, crd, end.label());
    }

    async fn write(&self, name: &str, job: &Job, status: &MigrationStatus) {
        let (field, manager) = job.status_field();
        let status = json!({ field: status });
        if let Err(error) = apply_status(&self.client, name, manager, status).await {
            warn!(policy = name, error = %error, "cannot write status.{field}");
        }
    }

    pub(super) async fn event(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        kube_events::send(
            &self.recorder,
            reference,
            kube_events::event(type_, reason, "Migrate", note),
        )
        .await;
    }

    fn record_result(&self, job: &Job, crd: &str, result: &str) {
        self.result_counter(job, crd, result).inc();
    }

    fn result_counter(&self, job: &Job, crd: &str, result: &str) -> Counter {
        let family = match job {
            Job::Migrate => &self.metrics.migrations,
            Job::CleanManagedFields { .. } => &self.metrics.managed_fields_cleanups,
        };
        family
            .get_or_create(&MigrationResultLabels {
                crd: crd.to_owned(),
                result: result.to_owned(),
            })
            .clone()
    }

    /// Creates the CRD's failure and result counters at 0 before the first run ends, so
    /// that the first failure is an increase Prometheus sees (`increase()` cannot count the
    /// first sample of a series born at 1).
    fn initialize_counters(&self, job: &Job, crd: &str) {
        for end in RunEnd::ALL {
            self.result_counter(job, crd, end.label());
        }
        let _ = self
            .metrics
            .objects_failed
            .get_or_create(&CrdLabels { crd: crd.to_owned() });
    }
}
