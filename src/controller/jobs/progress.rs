//! Progress of a running job: live counts for metrics, and the periodic status write with
//! the last checkpoint, so that a restarted controller resumes where this one stopped.

use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::BackgroundJobs;
use super::migrator_job::MigratorJob;
use crate::api::{MigrationCheckpoint, MigrationStatus};
use crate::controller::metrics::{CrdLabels, JobLabels, Metrics};
use crate::migrate::{self, Checkpoint, Counts, Rate, Resume, Target};
use crate::sync::lock;

impl BackgroundJobs {
    /// Writes the counts and the last checkpoint every few seconds while the run goes on.
    pub(super) fn report_progress(
        self: Arc<Self>,
        name: String,
        job: MigratorJob,
        mut status: MigrationStatus,
        progress: Arc<TaskProgress>,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut written = None;
            loop {
                tokio::time::sleep(self.progress_interval).await;
                let (live, total) = *lock(&progress.live);
                let target = lock(&progress.target).clone();
                let committed = lock(&progress.committed).clone();
                if let Some(target) = &target {
                    status.crd_generation = target.generation;
                    status.storage_version = target.storage_version.clone();
                }
                // The state the run's storage guard watches from: a resumed run replays the
                // CRD's history since.
                let watched_from = target.as_ref().map(|t| {
                    t.watched_from.as_ref().map_or((t.generation, None), |from| {
                        (from.generation, Some(from.resource_version.clone()))
                    })
                });
                apply_counts(&mut status, &live, total);
                match (committed, &target) {
                    (Some((Checkpoint::Continue(token), counts)), Some(target)) => {
                        let (crd_generation, crd_resource_version) = watched_from.unwrap_or_default();
                        status.checkpoint = Some(checkpoint_status(&Resume {
                            continue_token: token,
                            counts,
                            crd_generation,
                            crd_resource_version,
                            storage_version: target.storage_version.clone(),
                            conversion: target.conversion.clone(),
                        }));
                    }
                    (Some((Checkpoint::Finished, _)), _) => status.checkpoint = None,
                    _ => {}
                }
                if written.as_ref() != Some(&status) {
                    self.write(&name, &job, &status).await;
                    written = Some(status.clone());
                }
            }
        })
    }
}

/// Follows a running migration: counts and checkpoint for the status writer, and the
/// per-object metrics.
pub(super) struct TaskProgress {
    pub(super) metrics: Arc<Metrics>,
    /// Counts the objects done (migrated, or repaired).
    pub(super) done_counter:
        prometheus_client::metrics::family::Family<CrdLabels, prometheus_client::metrics::counter::Counter>,
    pub(super) labels: CrdLabels,
    pub(super) job_labels: JobLabels,
    /// Objects finished per second over the last 10 s.
    pub(super) rate: Mutex<Rate>,
    /// Live counts and total, for metrics and the status.
    pub(super) live: Mutex<(Counts, Option<u64>)>,
    /// What the current listing pass works on.
    pub(super) target: Mutex<Option<Target>>,
    /// The last checkpoint and the counts of the objects before it, for the status (so
    /// that a resumed run counts every object once).
    pub(super) committed: Mutex<Option<(Checkpoint, Counts)>>,
    /// Objects already counted in `objects_migrated`.
    pub(super) migrated: Mutex<u64>,
}

impl migrate::Observer for TaskProgress {
    fn started(&self, target: &Target, counts: &Counts) {
        *lock(&self.target) = Some(target.clone());
        lock(&self.rate).reset(Instant::now(), counts.done());
        *lock(&self.live) = (*counts, None);
        // A pass that starts afresh has no checkpoint yet.
        if counts.done() == 0 {
            *lock(&self.committed) = None;
        }
    }

    fn progress(&self, counts: &Counts, total: Option<u64>) {
        *lock(&self.live) = (*counts, total);
        let now = counts.rewritten + counts.skipped;
        let mut migrated = lock(&self.migrated);
        if now > *migrated {
            self.done_counter
                .get_or_create(&self.labels)
                .inc_by(now - *migrated);
        }
        *migrated = now;
        drop(migrated);
        let done = i64::try_from(counts.done()).unwrap_or(i64::MAX);
        self.metrics
            .job_objects_done
            .get_or_create(&self.job_labels)
            .set(done);
        let per_second = {
            let mut rate = lock(&self.rate);
            let at = Instant::now();
            rate.record(at, counts.done());
            rate.per_second(at)
        };
        self.metrics
            .job_objects_per_second
            .get_or_create(&self.job_labels)
            .set(per_second);
        if let Some(total) = total {
            self.metrics
                .job_objects_expected
                .get_or_create(&self.job_labels)
                .set(i64::try_from(total).unwrap_or(i64::MAX));
            let remaining = i64::try_from(total.saturating_sub(counts.done())).unwrap_or(i64::MAX);
            self.metrics
                .objects_remaining
                .get_or_create(&self.job_labels)
                .set(remaining);
        }
    }

    fn checkpoint(&self, checkpoint: &Checkpoint, committed: &Counts) {
        *lock(&self.committed) = Some((checkpoint.clone(), *committed));
    }
}

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(pub(super) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) fn checkpoint_status(resume: &Resume) -> MigrationCheckpoint {
    MigrationCheckpoint {
        continue_token: resume.continue_token.clone(),
        crd_generation: resume.crd_generation,
        crd_resource_version: resume.crd_resource_version.clone(),
        storage_version: resume.storage_version.clone(),
        conversion: resume.conversion.clone(),
        listed: resume.counts.listed,
        rewritten: resume.counts.rewritten,
        skipped: resume.counts.skipped,
    }
}

/// The counts into the status, with `progress` as `done/total` (`done/?` while the total
/// is not known yet).
pub(super) fn apply_counts(status: &mut MigrationStatus, counts: &Counts, total: Option<u64>) {
    status.listed = counts.listed;
    status.rewritten = counts.rewritten;
    status.skipped = counts.skipped;
    status.failed = counts.failed;
    if total.is_some() {
        status.total = total;
    }
    status.progress = Some(match status.total {
        Some(total) => format!("{}/{total}", counts.done()),
        None => format!("{}/?", counts.done()),
    });
}
