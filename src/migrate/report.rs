//! What a run reports: its counts, failures and outcome.

use std::time::Duration;

use super::{Counts, Mode, Target};

/// An object that could not be processed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub object: String,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every object is in the storage version and `status.storedVersions` was set to it
    /// alone (it listed `previous` before).
    Trimmed { previous: Vec<String> },
    /// `status.storedVersions` already listed only the storage version: nothing to do.
    AlreadyMigrated,
    /// Preflight: every object reads through the storage version.
    PreflightPassed,
    /// Some objects failed (see `failures`); `status.storedVersions` is untouched.
    Failed,
    /// Every object was rewritten but the CRD changed during the run, so
    /// `status.storedVersions` was left untouched.
    NotTrimmed { reason: String },
    /// No object's managedFields names a stale version any more.
    ManagedFieldsCleaned,
}

/// The result of a run.
#[derive(Clone, Debug)]
pub struct Report {
    pub target: Target,
    pub mode: Mode,
    pub outcome: Outcome,
    pub counts: Counts,
    /// The first failures (at most `max_reported_failures`).
    pub failures: Vec<Failure>,
    /// Listing passes that started over (changed storage version, an expired continue
    /// token without a fresh one).
    pub restarts: usize,
    /// Expired continue tokens (etcd compactions) the listing went on from.
    pub expired_tokens: usize,
    /// A managedFields cleanup that only counted (wrote nothing).
    pub dry_run: bool,
    pub elapsed: Duration,
    /// How long the settle check before the first list took (`discovery::wait`): on a CRD
    /// changed less than a minute ago, every apiserver must be seen acting on the change
    /// several times a second apart.
    pub settle_wait: Duration,
    /// A digest of every object listed (`ObjectsDigest::value`), when one pass listed them
    /// all (not after a resume from a checkpoint).
    pub objects_digest: Option<String>,
    /// With `Mode::Preflight`, when one pass listed them all: every object listed, for a
    /// later check to read only those changed since (`Settings::preflight_checked`).
    pub checked_objects: Option<super::CheckedObjects>,
}

impl Report {
    /// Whether the run did all it was asked to.
    pub fn succeeded(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::Trimmed { .. }
                | Outcome::AlreadyMigrated
                | Outcome::PreflightPassed
                | Outcome::ManagedFieldsCleaned
        )
    }

    /// One line for logs, events and status.
    pub fn summary(&self) -> String {
        let c = &self.counts;
        let counts = format!(
            "{} listed, {} {}, {} skipped, {} failed in {:.1}s",
            c.listed,
            c.rewritten,
            match self.mode {
                Mode::Preflight => "converted",
                Mode::CleanManagedFields if self.dry_run => "need a repair",
                Mode::CleanManagedFields => "repaired",
                Mode::Rewrite => "rewritten",
            },
            c.skipped,
            c.failed,
            self.elapsed.as_secs_f64()
        );
        // Only a wait worth telling (a just-changed CRD's confirmations).
        let counts = if self.settle_wait >= Duration::from_secs(1) {
            format!(
                "{counts} ({:.1}s of it confirming the apiservers act on the CRD as it is)",
                self.settle_wait.as_secs_f64()
            )
        } else {
            counts
        };
        let counts = match self.expired_tokens {
            0 => counts,
            n => format!("{counts}, going on after {n} expired continue tokens"),
        };
        let target = &self.target;
        match &self.outcome {
            Outcome::Trimmed { previous } => format!(
                "migrated {} to {}: {counts}; status.storedVersions trimmed from [{}] to [{}]",
                target.crd,
                target.storage_version,
                previous.join(", "),
                target.storage_version
            ),
            Outcome::AlreadyMigrated => format!(
                "{} needs no migration: status.storedVersions is already [{}]",
                target.crd, target.storage_version
            ),
            Outcome::PreflightPassed => format!(
                "preflight of {} through {}: every object converts ({counts})",
                target.crd, target.version
            ),
            Outcome::ManagedFieldsCleaned if self.dry_run => format!(
                "dry run, nothing written: managedFields of {}: {counts}",
                target.crd
            ),
            Outcome::ManagedFieldsCleaned => format!(
                "managedFields of {} name only versions it serves from now on: {counts}",
                target.crd
            ),
            Outcome::Failed => {
                let first: Vec<String> = self.failures.iter().take(3).map(ToString::to_string).collect();
                let what = match self.mode {
                    Mode::Rewrite => format!("migration of {} to {}", target.crd, target.version),
                    Mode::Preflight => format!("preflight of {} through {}", target.crd, target.version),
                    Mode::CleanManagedFields => format!("managedFields cleanup of {}", target.crd),
                };
                format!(
                    "{what} failed: {counts}; status.storedVersions left untouched; first failures: {}",
                    first.join("; ")
                )
            }
            Outcome::NotTrimmed { reason } => format!(
                "objects of {} rewritten to {} ({counts}) but status.storedVersions left untouched: {reason}",
                target.crd, target.storage_version
            ),
        }
    }
}
