//! Which run is which (pure): the key a run goes under (its CRD, and which of the CRD's
//! runs it is) and its goal (what it works towards). The runner keeps one run per key: the
//! same goal again is the run under way, another goal can only end in a restart.

use std::fmt;

/// Where a run goes: one run per key at a time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum JobKey {
    /// The CRD's migration, whichever engine runs it: one migration per CRD.
    Migration { crd: String },
    /// The CRD's managedFields cleanup.
    ManagedFieldsCleanup { crd: String },
    /// The CRD's conversion preflight through `version` (its run, or its check before the
    /// store); also what its objects are remembered under.
    Preflight { crd: String, version: String },
}

/// As logged: `<crd>`, `managed-fields/<crd>` or `preflight/<crd>/<version>`.
impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobKey::Migration { crd } => write!(f, "{crd}"),
            JobKey::ManagedFieldsCleanup { crd } => write!(f, "managed-fields/{crd}"),
            JobKey::Preflight { crd, version } => write!(f, "preflight/{crd}/{version}"),
        }
    }
}

/// What a run works towards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Goal {
    /// The internal migrator rewrites every object into `storage`, then trims
    /// `storedVersions`.
    Migrate { storage: String },
    /// A StorageVersionMigration into `storage` is followed (the built-in engine). It shares
    /// the migration's key: one migration per CRD, whatever the engine.
    FollowBuiltin { storage: String },
    /// The managedFields entries naming `versions` are rewritten into `storage`. The gone
    /// versions a cleanup records are not part of it: a cleanup under way is not restarted
    /// for them.
    CleanManagedFields { storage: String, versions: Vec<String> },
    /// Every object is read through `version`: a conversion preflight, or the check of a
    /// passed one before its store (they do not replace each other).
    Preflight { version: String },
}

impl Goal {
    /// The key its run goes under, for `crd`.
    pub(super) fn key(&self, crd: &str) -> JobKey {
        let crd = crd.to_owned();
        match self {
            Goal::Migrate { .. } | Goal::FollowBuiltin { .. } => JobKey::Migration { crd },
            Goal::CleanManagedFields { .. } => JobKey::ManagedFieldsCleanup { crd },
            Goal::Preflight { version } => JobKey::Preflight {
                crd,
                version: version.clone(),
            },
        }
    }
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
    /// The migration a run towards `goal` is, if it is one.
    pub(super) fn of(goal: Goal) -> Option<Self> {
        match goal {
            Goal::Migrate { storage } => Some(RunningMigration {
                storage_version: storage,
                builtin: false,
            }),
            Goal::FollowBuiltin { storage } => Some(RunningMigration {
                storage_version: storage,
                builtin: true,
            }),
            Goal::CleanManagedFields { .. } | Goal::Preflight { .. } => None,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_migration_shares_its_key_whatever_the_engine_and_other_runs_have_their_own() {
        let crd = "widgets.example.com";
        let migrate = Goal::Migrate {
            storage: "v1".to_owned(),
        };
        let follow = Goal::FollowBuiltin {
            storage: "v1".to_owned(),
        };
        assert_eq!(migrate.key(crd), follow.key(crd));
        assert_ne!(migrate, follow, "another goal: the run under way is aborted");
        let cleanup = Goal::CleanManagedFields {
            storage: "v1".to_owned(),
            versions: vec!["v1alpha1".to_owned()],
        };
        assert_eq!(cleanup.key(crd).to_string(), format!("managed-fields/{crd}"));
        let preflight = Goal::Preflight {
            version: "v1".to_owned(),
        };
        assert_eq!(preflight.key(crd).to_string(), format!("preflight/{crd}/v1"));
        assert_eq!(
            RunningMigration::of(follow),
            Some(RunningMigration {
                storage_version: "v1".to_owned(),
                builtin: true
            })
        );
        assert_eq!(RunningMigration::of(cleanup), None);
    }
}
