//! Policy + CRD + instant → the CRD's versions as they must be, what is next, what is blocked.

use jiff::Timestamp;

use super::crd::{CrdState, CrdVersion};
use super::error::Error;
use super::schedule::{Schedule, ScheduledVersion, Transition};
use crate::api::{MilestoneKind, VersionPhase, VersionPolicySpec};

/// A storage-version migration that finished: every object was rewritten into
/// `storage_version` and `status.storedVersions` was trimmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletedMigration {
    pub storage_version: String,
    pub finished_at: Timestamp,
}

/// One version of the CRD as it must be at the evaluated instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredVersion {
    pub name: String,
    /// Whether the policy governs this version (else its flags are left as they are,
    /// except `storage`).
    pub governed: bool,
    /// Whether the version stays in the CRD's `spec.versions`.
    pub present: bool,
    pub served: bool,
    pub storage: bool,
    pub deprecated: bool,
    pub deprecation_warning: Option<String>,
    pub phase: VersionPhase,
}

impl DesiredVersion {
    /// Whether the CRD's entry already carries these flags.
    pub fn matches(&self, current: &CrdVersion) -> bool {
        self.present
            && current.served == self.served
            && current.storage == self.storage
            && current.deprecated == self.deprecated
            && current.deprecation_warning == self.deprecation_warning
    }
}

/// Why something the schedule says is due does not happen yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockReason {
    /// A removal waits until the version is gone from `status.storedVersions`, or a
    /// removal or store waits for a StorageVersionMigration to finish.
    AwaitingMigration,
    /// The resulting CRD would break an invariant; nothing is changed.
    UnsafeState,
    /// A milestone that needs approval has none yet.
    AwaitingApproval,
    /// Clients still call the version an `unserve` with a traffic gate applies to.
    VersionInUse,
    /// A `store` waits for the conversion preflight to finish.
    AwaitingPreflight,
    /// A `store` is held because objects failed to convert to the new version.
    ConversionPreflightFailed,
    /// A removal waits until no object's managedFields names the version.
    AwaitingManagedFieldsCleanup,
}

impl BlockReason {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockReason::AwaitingMigration => "AwaitingMigration",
            BlockReason::UnsafeState => "UnsafeState",
            BlockReason::AwaitingApproval => "AwaitingApproval",
            BlockReason::VersionInUse => "VersionInUse",
            BlockReason::AwaitingPreflight => "AwaitingPreflight",
            BlockReason::ConversionPreflightFailed => "ConversionPreflightFailed",
            BlockReason::AwaitingManagedFieldsCleanup => "AwaitingManagedFieldsCleanup",
        }
    }
}

/// A due transition that is held back, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub reason: BlockReason,
    pub version: String,
    pub milestone: Option<MilestoneKind>,
    pub message: String,
}

/// `status.storedVersions` lists versions other than the storage version: their objects
/// must be rewritten before those versions can be dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationNeed {
    pub storage_version: String,
    pub stale_versions: Vec<String>,
}

/// Everything the engine decides for one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// The instant evaluated.
    pub at: Timestamp,
    /// Every version of the CRD, in CRD order, as it must be.
    pub versions: Vec<DesiredVersion>,
    /// Every milestone of the policy with its instant, in order.
    pub timeline: Vec<Transition>,
    /// Due transitions that are held back.
    pub blocked: Vec<Blocked>,
    /// Objects still stored in old versions, if any.
    pub migration: Option<MigrationNeed>,
    /// When a held transition may proceed by time alone (a traffic window ending).
    pub wake_at: Option<Timestamp>,
}

impl Evaluation {
    /// The first transition scheduled after the evaluated instant.
    pub fn next_transition(&self) -> Option<&Transition> {
        self.timeline.iter().find(|t| t.at > self.at)
    }

    /// The storage version the CRD must have.
    pub fn storage_version(&self) -> Option<&str> {
        self.versions
            .iter()
            .find(|v| v.present && v.storage)
            .map(|v| v.name.as_str())
    }

    pub fn version(&self, name: &str) -> Option<&DesiredVersion> {
        self.versions.iter().find(|v| v.name == name)
    }

    /// Whether the CRD already is exactly as it must be.
    pub fn is_satisfied_by(&self, crd: &CrdState) -> bool {
        self.versions.iter().all(|d| match crd.version(&d.name) {
            Some(current) => d.matches(current),
            None => !d.present,
        }) && crd.versions.iter().all(|c| self.version(&c.name).is_some())
    }

    /// The transitions due at the evaluated instant whose effect the CRD does not show
    /// yet (what applying this evaluation will do), in timeline order.
    pub fn pending_transitions(&self, crd: &CrdState) -> Vec<&Transition> {
        self.timeline
            .iter()
            .filter(|t| t.at <= self.at)
            .filter(|t| {
                let (Some(desired), Some(current)) = (self.version(&t.version), crd.version(&t.version))
                else {
                    return false;
                };
                match t.milestone {
                    MilestoneKind::Introduce => desired.served && !current.served,
                    MilestoneKind::Store => desired.storage && !current.storage,
                    MilestoneKind::Deprecate => desired.deprecated && !current.deprecated,
                    MilestoneKind::Unserve => desired.present && !desired.served && current.served,
                    MilestoneKind::Remove => !desired.present,
                }
            })
            .collect()
    }
}

/// Evaluates a policy for a CRD at an instant. `crd.stored_versions` is authoritative for
/// what may be removed; `migrations` says which storage migrations already finished.
pub fn evaluate(
    spec: &VersionPolicySpec,
    crd: &CrdState,
    migrations: &[CompletedMigration],
    at: Timestamp,
) -> Result<Evaluation, Error> {
    let schedule = Schedule::new(spec, crd, at)?;
    Ok(schedule.evaluate(crd, migrations, at))
}

impl Schedule {
    /// Evaluates an already validated schedule. Never produces a CRD that breaks an
    /// invariant: such a state is reported as [`BlockReason::UnsafeState`] and the CRD's
    /// current versions are returned unchanged.
    pub fn evaluate(&self, crd: &CrdState, migrations: &[CompletedMigration], at: Timestamp) -> Evaluation {
        let stored_versions = crd.effective_stored_versions();
        let policy_storage = self.storage_at(at).map(|v| v.name.as_str());
        let mut blocked = Vec::new();
        let mut versions: Vec<DesiredVersion> = crd
            .versions
            .iter()
            .map(|current| match self.version(&current.name) {
                Some(scheduled) => desired_governed(scheduled, current, policy_storage, at),
                None => desired_ungoverned(current, policy_storage),
            })
            .collect();

        let storage = versions.iter().find(|v| v.storage).map(|v| v.name.clone());
        for desired in versions.iter_mut().filter(|v| !v.present) {
            if stored_versions.contains(&desired.name) {
                desired.present = true;
                desired.phase = VersionPhase::Unserved;
                blocked.push(Blocked {
                    reason: BlockReason::AwaitingMigration,
                    version: desired.name.clone(),
                    milestone: Some(MilestoneKind::Remove),
                    message: held_removal_message(
                        &desired.name,
                        &stored_versions,
                        storage.as_deref(),
                        self,
                        migrations,
                    ),
                });
            } else if crd.managed_fields_pending.contains(&desired.name) {
                desired.present = true;
                desired.phase = VersionPhase::Unserved;
                blocked.push(Blocked {
                    reason: BlockReason::AwaitingManagedFieldsCleanup,
                    version: desired.name.clone(),
                    milestone: Some(MilestoneKind::Remove),
                    message: format!(
                        "removal of {} waits until no object's metadata.managedFields names it: server-side apply of \
                         such objects fails once the version is gone; their entries are being rewritten into {}",
                        desired.name,
                        storage.as_deref().unwrap_or("the storage version")
                    ),
                });
            } else if let Some(migration) = &crd.unfinished_migration {
                desired.present = true;
                desired.phase = VersionPhase::Unserved;
                blocked.push(Blocked {
                    reason: BlockReason::AwaitingMigration,
                    version: desired.name.clone(),
                    milestone: Some(MilestoneKind::Remove),
                    message: format!(
                        "removal of {} waits until {migration}: Kubernetes' storage version migrator \
                         can trim status.storedVersions before every object is rewritten (as a migration starts, \
                         and as a failed one ends)",
                        desired.name
                    ),
                });
            }
        }

        let migration = storage.as_ref().and_then(|storage| {
            let stale_versions: Vec<String> = stored_versions
                .iter()
                .filter(|v| *v != storage)
                .cloned()
                .collect();
            (!stale_versions.is_empty()).then(|| MigrationNeed {
                storage_version: storage.clone(),
                stale_versions,
            })
        });

        if let Some(problem) = invariant_violation(&versions, &stored_versions) {
            blocked.push(Blocked {
                reason: BlockReason::UnsafeState,
                version: problem.0,
                milestone: None,
                message: format!("{}; the CRD is left unchanged", problem.1),
            });
            versions = crd
                .versions
                .iter()
                .map(|c| unchanged(c, self.version(&c.name).is_some()))
                .collect();
        }

        Evaluation {
            at,
            versions,
            timeline: self.transitions(),
            blocked,
            migration,
            wake_at: None,
        }
    }
}

fn desired_governed(
    scheduled: &ScheduledVersion,
    current: &CrdVersion,
    policy_storage: Option<&str>,
    at: Timestamp,
) -> DesiredVersion {
    let present = scheduled.present(at);
    let served = present && scheduled.served_if_present(at);
    let deprecated = scheduled.deprecated(at);
    let storage = match policy_storage {
        Some(name) => name == scheduled.name,
        None => current.storage,
    };
    let phase = if !present {
        VersionPhase::Removed
    } else if scheduled.reached(MilestoneKind::Unserve, at) {
        VersionPhase::Unserved
    } else if !served {
        VersionPhase::Pending
    } else {
        phase_of_served(storage, deprecated)
    };
    DesiredVersion {
        name: scheduled.name.clone(),
        governed: true,
        present,
        served,
        storage,
        deprecated,
        deprecation_warning: if deprecated {
            scheduled.warning.clone()
        } else {
            None
        },
        phase,
    }
}

fn desired_ungoverned(current: &CrdVersion, policy_storage: Option<&str>) -> DesiredVersion {
    let mut desired = unchanged(current, false);
    if policy_storage.is_some() {
        desired.storage = false;
        desired.phase = phase_of_flags(desired.served, false, desired.deprecated);
    }
    desired
}

fn unchanged(current: &CrdVersion, governed: bool) -> DesiredVersion {
    DesiredVersion {
        name: current.name.clone(),
        governed,
        present: true,
        served: current.served,
        storage: current.storage,
        deprecated: current.deprecated,
        deprecation_warning: current.deprecation_warning.clone(),
        phase: phase_of_flags(current.served, current.storage, current.deprecated),
    }
}

/// The phase a version's flags alone show (without its schedule, a version that is not
/// served reads as Unserved).
pub fn phase_of_flags(served: bool, storage: bool, deprecated: bool) -> VersionPhase {
    if served {
        phase_of_served(storage, deprecated)
    } else {
        VersionPhase::Unserved
    }
}

fn phase_of_served(storage: bool, deprecated: bool) -> VersionPhase {
    if deprecated {
        VersionPhase::Deprecated
    } else if storage {
        VersionPhase::Stored
    } else {
        VersionPhase::Served
    }
}

/// The first invariant the desired versions break, as (version, explanation).
fn invariant_violation(versions: &[DesiredVersion], stored_versions: &[String]) -> Option<(String, String)> {
    let present: Vec<&DesiredVersion> = versions.iter().filter(|v| v.present).collect();
    let storage: Vec<&DesiredVersion> = present.iter().copied().filter(|v| v.storage).collect();
    if storage.len() != 1 {
        let names: Vec<&str> = storage.iter().map(|v| v.name.as_str()).collect();
        return Some((
            names.join(","),
            format!(
                "the CRD would have {} storage versions ({names:?}); it needs exactly one",
                storage.len()
            ),
        ));
    }
    if !storage[0].served {
        return Some((
            storage[0].name.clone(),
            format!("the storage version {} would not be served", storage[0].name),
        ));
    }
    if !present.iter().any(|v| v.served) {
        return Some((String::new(), "no version would be served".to_owned()));
    }
    if let Some(missing) = stored_versions
        .iter()
        .find(|s| !present.iter().any(|v| &v.name == *s))
    {
        return Some((
            missing.clone(),
            format!("{missing} is listed in status.storedVersions but would not be in spec.versions"),
        ));
    }
    None
}

fn held_removal_message(
    version: &str,
    stored_versions: &[String],
    storage: Option<&str>,
    schedule: &Schedule,
    migrations: &[CompletedMigration],
) -> String {
    let storage = storage.unwrap_or("the storage version");
    let mut message = format!(
        "removal of {version} is held: status.storedVersions still lists it ({}), so objects may still be \
         stored in {version}; they must be migrated to {storage} first",
        stored_versions.join(", ")
    );
    let finished = migrations
        .iter()
        .filter(|m| m.storage_version == storage)
        .map(|m| m.finished_at)
        .max();
    if let Some(finished_at) = finished {
        message.push_str(&format!(
            "; a migration to {storage} finished at {finished_at}, waiting for status.storedVersions to be trimmed"
        ));
    } else if !schedule.migration.enabled {
        message.push_str(&format!(
            "; spec.migration.enabled is false, so run `crd-lifecycle migrate {}`",
            schedule.crd_name
        ));
    }
    message
}
