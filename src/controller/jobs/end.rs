//! How a run of the migrator (either engine) ends: its status (phase, end time, message),
//! its Event and its result counter, and the status writes it makes on the way.

use super::migrator_job::Stage;
use crate::controller::events::EventReason;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use prometheus_client::metrics::counter::Counter;
use serde_json::json;
use tracing::{info, warn};

use super::BackgroundJobs;
use super::migrator_job::MigratorJob;
use super::progress::apply_counts;
use crate::api::{MigrationPhase, MigrationStatus};
use crate::controller::metrics::{CrdLabels, MigrationResultLabels};
use crate::controller::status::apply_status;
use crate::migrate::{self, Report};

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RunEnd {
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

impl BackgroundJobs {
    pub(super) async fn finish(
        &self,
        name: &str,
        reference: &ObjectReference,
        job: &MigratorJob,
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
    pub(super) async fn conclude(
        &self,
        name: &str,
        reference: &ObjectReference,
        job: &MigratorJob,
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
        let reason = match end {
            RunEnd::Succeeded => job.reason(Stage::Succeeded),
            RunEnd::MissingPermission => EventReason::MissingPermission,
            RunEnd::Failed | RunEnd::Error => job.reason(Stage::Failed),
        };
        self.event(reference, reason, message).await;
        self.record_result(job, crd, end.label());
    }

    pub(super) async fn write(&self, name: &str, job: &MigratorJob, status: &MigrationStatus) {
        let (field, manager) = job.status_field();
        let status = json!({ field: status });
        if let Err(error) = apply_status(&self.client, name, manager, status).await {
            warn!(policy = name, error = %error, "cannot write status.{field}");
        }
    }

    fn record_result(&self, job: &MigratorJob, crd: &str, result: &str) {
        self.result_counter(job, crd, result).inc();
    }

    fn result_counter(&self, job: &MigratorJob, crd: &str, result: &str) -> Counter {
        let family = match job {
            MigratorJob::Migrate => &self.metrics.migrations,
            MigratorJob::CleanManagedFields { .. } => &self.metrics.managed_fields_cleanups,
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
    pub(super) fn initialize_counters(&self, job: &MigratorJob, crd: &str) {
        for end in RunEnd::ALL {
            self.result_counter(job, crd, end.label());
        }
        let _ = self
            .metrics
            .objects_failed
            .get_or_create(&CrdLabels { crd: crd.to_owned() });
    }
}
