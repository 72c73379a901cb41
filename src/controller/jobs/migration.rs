//! The internal migrator's runs: a migration after a `store` (every object rewritten into
//! the storage version, then `storedVersions` trimmed) or a managedFields cleanup before a
//! removal, each resumed from its checkpoint in the policy's status.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::migrator_job::Stage;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use tokio::time::Instant;
use tracing::{info, warn};

use super::BackgroundJobs;
use super::end::RunEnd;
use super::migrator_job::MigratorJob;
use super::progress::{AbortOnDrop, TaskProgress, apply_counts, checkpoint_status};
use crate::api::{MigrationStatus, VersionPolicy};
use crate::controller::metrics::{CrdLabels, JobLabels};
use crate::migrate::{self, Counts, Mode, Outcome, Report, Resume};
use crate::sync::lock;

/// How often a run that could not trim because the CRD changed meanwhile is repeated at
/// once.
pub(super) const MAX_RERUNS: usize = 5;

/// The window over which a running job's rate is measured.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// A run as it starts: its first status (written), what it is called in messages, and
/// where it resumes.
struct Opened {
    status: MigrationStatus,
    what: String,
    resume: Option<Resume>,
}

impl BackgroundJobs {
    /// Starts migrating the policy's CRD into `storage_version` unless that already runs
    /// or the last run failed recently. Returns whether a migration is running now.
    pub(crate) fn ensure(self: &Arc<Self>, policy: &VersionPolicy, storage_version: &str) -> bool {
        self.start(policy, storage_version, MigratorJob::Migrate, None)
    }

    /// Starts rewriting the managedFields entries that name `versions` (versions whose
    /// removal is due) into the storage version, unless that already runs or failed
    /// recently; the result goes to `status.managedFieldsCleanup`.
    /// Returns whether a cleanup is under way now.
    /// `crd_generation`: the CRD's generation now; a cleanup that succeeded at another
    /// one does not count (`decide::managed_fields_pending`). `gone`: the versions its status
    /// records as cleaned while gone from the CRD (`MigrationStatus::gone_versions`).
    pub(crate) fn ensure_cleanup(
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
            MigratorJob::CleanManagedFields { versions, gone },
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
        job: MigratorJob,
        crd_generation: Option<i64>,
    ) -> bool {
        let goal = job.goal(storage_version);
        let held = self.failed_recently(&job, policy, storage_version);
        let this = self.clone();
        let crd = policy.spec.crd_name.clone();
        let policy = policy.clone();
        let storage = storage_version.to_owned();
        self.launch(&crd, goal, held, async move {
            this.run(policy, storage, job, crd_generation).await
        })
    }

    /// Whether the last run of `job` towards `storage_version` failed less than
    /// `retry_after_failure` ago, by the policy's status (`MigratorJob::failed_recently`, on this
    /// controller's clock).
    pub(super) fn failed_recently(
        &self,
        job: &MigratorJob,
        policy: &VersionPolicy,
        storage_version: &str,
    ) -> bool {
        job.failed_recently(policy, storage_version, self.now(), self.retry_after_failure)
    }

    async fn run(
        self: Arc<Self>,
        policy: VersionPolicy,
        storage_version: String,
        job: MigratorJob,
        crd_generation: Option<i64>,
    ) {
        // Decided again on the status as it is (a run that failed or a cleanup that
        // succeeded moments ago may not show in the cache yet), and resumed from its
        // latest checkpoint.
        let policy = self.fresh(policy).await;
        if self.failed_recently(&job, &policy, &storage_version)
            || job.cleaned(&policy, &storage_version, crd_generation)
        {
            return;
        }
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let crd = policy.spec.crd_name.clone();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let reference = policy.object_ref(&());
        let Opened {
            mut status,
            what,
            resume,
        } = self
            .open(&policy, &storage_version, &job, &crd, &name, &reference)
            .await;

        let migrate_settings = self.rewrite_settings(&policy, &job, resume);
        let (progress, job_labels) = self.task_progress(&job, &crd, &migrate_settings);
        // Aborted when this run ends, and also when the run itself is aborted (shutdown).
        let reporter = AbortOnDrop(self.clone().report_progress(
            name.clone(),
            job.clone(),
            status.clone(),
            progress.clone(),
        ));
        let started = Instant::now();
        let result = self.rewrite(&crd, &migrate_settings, &progress).await;
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

    /// The run's first status (resumed from the previous run's checkpoint, if any), written
    /// with its Event.
    async fn open(
        &self,
        policy: &VersionPolicy,
        storage_version: &str,
        job: &MigratorJob,
        crd: &str,
        name: &str,
        reference: &ObjectReference,
    ) -> Opened {
        let previous = job.previous(policy);
        let resume = job.resume_from(previous.as_ref(), storage_version);
        let started_at = match &resume {
            Some(_) => previous
                .as_ref()
                .and_then(|m| m.started_at.clone())
                .unwrap_or(Time(self.now())),
            None => Time(self.now()),
        };
        // Read before the run lists its first object (a resumed run keeps what its start
        // read): the failed migrations this run covers if it rewrites every object.
        let (covers_failed_migrations, covers_failed_migration_on_crd) = match (job, &resume) {
            (MigratorJob::Migrate, Some(_)) => previous.as_ref().map_or_else(Default::default, |run| {
                (
                    run.covers_failed_migrations.clone(),
                    run.covers_failed_migration_on_crd.clone(),
                )
            }),
            (MigratorJob::Migrate, None) => self.processed_failures(crd).await,
            (MigratorJob::CleanManagedFields { .. }, _) => Default::default(),
        };
        let mut status = MigrationStatus {
            versions: job.versions(),
            gone_versions: job.gone(),
            crd_generation: resume.as_ref().and_then(|r| r.crd_generation),
            covers_failed_migrations,
            covers_failed_migration_on_crd,
            ..MigrationStatus::running(storage_version, started_at)
        };
        let what = match job {
            MigratorJob::Migrate => format!("the migration of {crd} to {storage_version}"),
            MigratorJob::CleanManagedFields { versions, .. } => format!(
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
        let reason = job.reason(if resume.is_some() {
            Stage::Resumed
        } else {
            Stage::Started
        });
        self.event(reference, reason, note).await;
        self.write(name, job, &status).await;
        Opened { status, what, resume }
    }

    /// How the migrator runs `job` over the policy's CRD, from `resume` if given.
    fn rewrite_settings(
        &self,
        policy: &VersionPolicy,
        job: &MigratorJob,
        resume: Option<Resume>,
    ) -> migrate::Settings {
        let settings = &policy.spec.migration;
        migrate::Settings {
            concurrency: usize::try_from(settings.concurrency).unwrap_or(16),
            page_size: settings.page_size,
            qps: settings.qps,
            mode: match job {
                MigratorJob::Migrate => Mode::Rewrite,
                MigratorJob::CleanManagedFields { .. } => Mode::CleanManagedFields,
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
        }
    }

    /// What follows the run (its counters created at 0), and its `job` labels.
    fn task_progress(
        &self,
        job: &MigratorJob,
        crd: &str,
        migrate_settings: &migrate::Settings,
    ) -> (Arc<TaskProgress>, JobLabels) {
        let labels = CrdLabels { crd: crd.to_owned() };
        let job_labels = JobLabels {
            crd: crd.to_owned(),
            job: job.label().to_owned(),
        };
        self.initialize_counters(job, crd);
        let progress = Arc::new(TaskProgress {
            metrics: self.metrics.clone(),
            done_counter: match job {
                MigratorJob::Migrate => self.metrics.objects_migrated.clone(),
                MigratorJob::CleanManagedFields { .. } => self.metrics.objects_repaired.clone(),
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
        (progress, job_labels)
    }

    /// Runs the migrator, again (bounded) while it could not trim.
    async fn rewrite(
        &self,
        crd: &str,
        migrate_settings: &migrate::Settings,
        progress: &Arc<TaskProgress>,
    ) -> Result<Report, migrate::Error> {
        let mut result = migrate::migrate(&self.client, crd, migrate_settings, progress.as_ref()).await;
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
            result = migrate::migrate(&self.client, crd, &fresh, progress.as_ref()).await;
        }
        result
    }
}
