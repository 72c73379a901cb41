//! What a background run does: a migration or a managedFields cleanup, with the status
//! field, field manager, event reasons and metrics that belong to each.

use crate::api::{MigrationPhase, MigrationStatus, VersionPolicy};
use crate::migrate::{Counts, Resume};

use super::{CLEANUP_FIELD_MANAGER, MIGRATION_FIELD_MANAGER};

/// What a background run does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Job {
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

impl Job {
    /// The key of its run and of its last failure.
    pub(super) fn key(&self, crd: &str) -> String {
        match self {
            Job::Migrate => crd.to_owned(),
            Job::CleanManagedFields { .. } => format!("managed-fields/{crd}"),
        }
    }

    /// What a run of it works towards: the storage version (and, for a cleanup, its
    /// versions).
    pub(super) fn goal(&self, storage_version: &str) -> String {
        match self {
            Job::Migrate => storage_version.to_owned(),
            Job::CleanManagedFields { versions, .. } => format!("{storage_version} {}", versions.join(",")),
        }
    }

    /// Its status field and field manager.
    pub(super) fn status_field(&self) -> (&'static str, &'static str) {
        match self {
            Job::Migrate => ("migration", MIGRATION_FIELD_MANAGER),
            Job::CleanManagedFields { .. } => ("managedFieldsCleanup", CLEANUP_FIELD_MANAGER),
        }
    }

    /// The status of its previous run.
    pub(super) fn previous(&self, policy: &VersionPolicy) -> Option<MigrationStatus> {
        let status = policy.status.as_ref()?;
        match self {
            Job::Migrate => status.migration.clone(),
            Job::CleanManagedFields { .. } => status.managed_fields_cleanup.clone(),
        }
    }

    /// The event reason of a stage (`Started`, `Resumed`, `Succeeded`, `Failed`).
    pub(super) fn reason(&self, stage: &str) -> String {
        match self {
            Job::Migrate => format!("Migration{stage}"),
            Job::CleanManagedFields { .. } => format!("ManagedFieldsCleanup{stage}"),
        }
    }

    /// Its `job` label in metrics.
    pub(super) fn label(&self) -> &'static str {
        match self {
            Job::Migrate => "migration",
            Job::CleanManagedFields { .. } => "managed_fields_cleanup",
        }
    }

    pub(super) fn versions(&self) -> Vec<String> {
        match self {
            Job::Migrate => Vec::new(),
            Job::CleanManagedFields { versions, .. } => versions.clone(),
        }
    }

    /// For a cleanup: the gone versions its status records (`MigrationStatus::gone_versions`).
    pub(super) fn gone(&self) -> Vec<String> {
        match self {
            Job::Migrate => Vec::new(),
            Job::CleanManagedFields { gone, .. } => gone.clone(),
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
