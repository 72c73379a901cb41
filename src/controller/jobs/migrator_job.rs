//! What a background run of the migrator does: a migration or a managedFields cleanup, with
//! the status field, field manager, event reasons and metrics that belong to each, and what
//! its last run (by the policy's status) says about the next (pure).

use crate::controller::events::EventReason;
use std::time::Duration;

use jiff::Timestamp;

use super::goal::Goal;
use super::{CLEANUP_FIELD_MANAGER, MIGRATION_FIELD_MANAGER};
use crate::api::{MigrationPhase, MigrationStatus, VersionPolicy};
use crate::migrate::{Counts, Resume};

/// What a background run does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum MigratorJob {
    /// Rewrite every object into the storage version, then trim `storedVersions`.
    Migrate,
    /// Rewrite the managedFields entries naming these versions into the storage version;
    /// `gone`: those of them the CRD no longer has, and those an earlier cleanup rewrote
    /// while they were gone (`MigrationStatus::gone_versions`).
    CleanManagedFields {
        versions: Vec<String>,
        gone: Vec<String>,
    },
}

/// A stage of a run that publishes an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    Started,
    Resumed,
    Succeeded,
    Failed,
}

impl MigratorJob {
    /// What a run of it works towards: the storage version (and, for a cleanup, its
    /// versions).
    pub(super) fn goal(&self, storage_version: &str) -> Goal {
        let storage = storage_version.to_owned();
        match self {
            MigratorJob::Migrate => Goal::Migrate { storage },
            MigratorJob::CleanManagedFields { versions, .. } => Goal::CleanManagedFields {
                storage,
                versions: versions.clone(),
            },
        }
    }

    /// Whether its last run towards `storage_version` failed less than
    /// `retry_after_failure` before `now`, by the policy's status (`phase` and `finishedAt`,
    /// on this controller's clock): a new leader holds it back as long as the old one would
    /// have.
    pub(super) fn failed_recently(
        &self,
        policy: &VersionPolicy,
        storage_version: &str,
        now: Timestamp,
        retry_after_failure: Duration,
    ) -> bool {
        let wait = jiff::SignedDuration::try_from(retry_after_failure).unwrap_or(jiff::SignedDuration::MAX);
        self.previous(policy).is_some_and(|previous| {
            previous.phase == MigrationPhase::Failed
                && previous.storage_version == storage_version
                && previous.versions == self.versions()
                && previous
                    .finished_at
                    .is_some_and(|at| now.duration_since(at.0) < wait)
        })
    }

    /// Whether a cleanup like this one towards `storage_version` already succeeded at the
    /// CRD's generation `crd_generation`, by the policy's status.
    pub(super) fn cleaned(
        &self,
        policy: &VersionPolicy,
        storage_version: &str,
        crd_generation: Option<i64>,
    ) -> bool {
        matches!(self, MigratorJob::CleanManagedFields { .. })
            && self.previous(policy).is_some_and(|previous| {
                previous.succeeded_at(crd_generation)
                    && previous.storage_version == storage_version
                    && self.versions().iter().all(|v| previous.versions.contains(v))
            })
    }

    /// Its status field and field manager.
    pub(super) fn status_field(&self) -> (&'static str, &'static str) {
        match self {
            MigratorJob::Migrate => ("migration", MIGRATION_FIELD_MANAGER),
            MigratorJob::CleanManagedFields { .. } => ("managedFieldsCleanup", CLEANUP_FIELD_MANAGER),
        }
    }

    /// The status of its previous run.
    pub(super) fn previous(&self, policy: &VersionPolicy) -> Option<MigrationStatus> {
        let status = policy.status.as_ref()?;
        match self {
            MigratorJob::Migrate => status.migration.clone(),
            MigratorJob::CleanManagedFields { .. } => status.managed_fields_cleanup.clone(),
        }
    }

    /// The event reason of a stage of its run.
    pub(super) fn reason(&self, stage: Stage) -> EventReason {
        match (self, stage) {
            (MigratorJob::Migrate, Stage::Started) => EventReason::MigrationStarted,
            (MigratorJob::Migrate, Stage::Resumed) => EventReason::MigrationResumed,
            (MigratorJob::Migrate, Stage::Succeeded) => EventReason::MigrationSucceeded,
            (MigratorJob::Migrate, Stage::Failed) => EventReason::MigrationFailed,
            (MigratorJob::CleanManagedFields { .. }, Stage::Started) => {
                EventReason::ManagedFieldsCleanupStarted
            }
            (MigratorJob::CleanManagedFields { .. }, Stage::Resumed) => {
                EventReason::ManagedFieldsCleanupResumed
            }
            (MigratorJob::CleanManagedFields { .. }, Stage::Succeeded) => {
                EventReason::ManagedFieldsCleanupSucceeded
            }
            (MigratorJob::CleanManagedFields { .. }, Stage::Failed) => {
                EventReason::ManagedFieldsCleanupFailed
            }
        }
    }

    /// Its `job` label in metrics.
    pub(super) fn label(&self) -> &'static str {
        match self {
            MigratorJob::Migrate => "migration",
            MigratorJob::CleanManagedFields { .. } => "managed_fields_cleanup",
        }
    }

    pub(super) fn versions(&self) -> Vec<String> {
        match self {
            MigratorJob::Migrate => Vec::new(),
            MigratorJob::CleanManagedFields { versions, .. } => versions.clone(),
        }
    }

    /// For a cleanup: the gone versions its status records (`MigrationStatus::gone_versions`).
    pub(super) fn gone(&self) -> Vec<String> {
        match self {
            MigratorJob::Migrate => Vec::new(),
            MigratorJob::CleanManagedFields { gone, .. } => gone.clone(),
        }
    }

    /// Where to resume: the checkpoint of a previous run of this job that was interrupted
    /// while working towards the same storage version. (The migrator itself starts afresh
    /// if the CRD changed since the checkpoint.)
    pub(super) fn resume_from(
        &self,
        previous: Option<&MigrationStatus>,
        storage_version: &str,
    ) -> Option<Resume> {
        previous
            .filter(|m| m.phase == MigrationPhase::Running && m.versions == self.versions())
            .and_then(|m| m.checkpoint.clone())
            .filter(|c| c.storage_version == storage_version)
            .map(|c| Resume {
                continue_token: c.continue_token,
                counts: Counts {
                    listed: c.listed,
                    rewritten: c.rewritten,
                    skipped: c.skipped,
                    failed: 0,
                },
                crd_generation: c.crd_generation,
                crd_resource_version: c.crd_resource_version,
                storage_version: c.storage_version,
                conversion: c.conversion,
            })
    }
}
