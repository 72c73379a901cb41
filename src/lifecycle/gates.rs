//! Gates: conditions a due transition must meet before it happens (an approval, no
//! traffic to a version, a conversion preflight passed for that store and checked shortly
//! before). A held transition, and every later
//! milestone of its version, is treated as not reached; so is the unserving or removal of
//! a version that stays the storage version because the `store` that would replace it is
//! held. Plain data in, plain data out, like the rest of the engine.

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};

use super::crd::CrdState;
use super::engine::{BlockReason, Blocked, CompletedMigration, Evaluation};
use super::schedule::Schedule;
use crate::api::MilestoneKind;

/// The annotation that approves milestones: `<version>.<milestone>`, comma-separated.
pub const APPROVE_ANNOTATION: &str = "crdlifecycle.io/approve";

/// Parses the approval annotation; returns the approvals and the entries that are not of
/// the form `<version>.<milestone>`.
pub fn parse_approvals(value: &str) -> (BTreeSet<(String, MilestoneKind)>, Vec<String>) {
    let mut approvals = BTreeSet::new();
    let mut invalid = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let parsed = entry.rsplit_once('.').and_then(|(version, milestone)| {
            let kind = MilestoneKind::ALL.into_iter().find(|k| k.as_str() == milestone)?;
            (!version.is_empty()).then(|| (version.to_owned(), kind))
        });
        match parsed {
            Some(approval) => {
                approvals.insert(approval);
            }
            None => invalid.push(entry.to_owned()),
        }
    }
    (approvals, invalid)
}

/// What the controller knows about the gates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GateInputs {
    /// The policy's name, for the approval command in messages.
    pub policy_name: String,
    /// Approved milestones, as (version, milestone).
    pub approvals: BTreeSet<(String, MilestoneKind)>,
    /// Transitions already applied (the policy's history): their gates are not checked again.
    pub applied: BTreeSet<(String, MilestoneKind)>,
    /// Client requests observed per version.
    pub traffic: BTreeMap<String, TrafficObservation>,
    /// Conversion preflights, per version they read through.
    pub preflight: BTreeMap<String, PreflightResult>,
    /// Per version with a writers gate: what is known of the field managers' writes
    /// through it (managedFields); absent before the objects are read.
    pub writers: BTreeMap<String, WritersRead>,
    /// What a `store` waits for while a StorageVersionMigration of the CRD's resource has
    /// not finished ("StorageVersionMigration X has finished"), or until it can be told
    /// whether one runs; `None` when none runs. Every `store` waits while one is set:
    /// Kubernetes' migrator rewrites each object through whichever apiserver answers, and
    /// one still encoding in the storage version of before a switch stores it there, in a
    /// version the migration then trims from `status.storedVersions`.
    pub migration_under_way: Option<String>,
}

/// What the controller read of the writes through one version (its objects'
/// `metadata.managedFields`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WritersRead {
    /// The objects are being read; this many so far.
    Reading { objects: u64 },
    /// Each field manager's last write through the version.
    Read(Vec<(String, Timestamp)>),
    /// The objects could not be read (why).
    Failed(String),
}

/// What the controller saw of the requests to one version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrafficObservation {
    /// Since when requests to the version are being counted.
    pub watching_since: Timestamp,
    /// The last instant a client request was seen (counters moved), if any.
    pub last_request: Option<Timestamp>,
}

impl TrafficObservation {
    /// When a window of `quiet` without requests will have been observed.
    pub fn quiet_since(&self) -> Timestamp {
        self.last_request
            .map_or(self.watching_since, |last| last.max(self.watching_since))
    }
}

/// The outcome of a conversion preflight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreflightResult {
    Running,
    Passed(PreflightPass),
    Failed(String),
}

/// A passed conversion preflight: for which store it ran, and when its objects were last
/// found fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreflightPass {
    /// The instant of the `store` it ran for.
    pub store_at: Timestamp,
    /// When its objects were last found fit: when it finished, or when the last check that
    /// listed them again (and read those changed since) started.
    pub checked_at: Timestamp,
    /// How long after `checked_at` it stands.
    pub stands_for: SignedDuration,
}

impl PreflightPass {
    /// Whether it stands for the `store` at `store_at`, at `now`: it ran for that store, and
    /// its objects were checked no longer than `stands_for` ago. A result from another
    /// store of the version, or one whose check a restart or a late reconcile missed, does
    /// not: the store waits for the check.
    pub fn stands(&self, store_at: Timestamp, now: Timestamp) -> bool {
        self.store_at == store_at && now.duration_since(self.checked_at) <= self.stands_for
    }
}

impl Schedule {
    /// Evaluates with gates: due transitions whose gate is not met are held back and
    /// reported (`AwaitingApproval`, `VersionInUse`, `AwaitingPreflight`,
    /// `ConversionPreflightFailed`). `wake_at` says when a held transition may proceed by
    /// time alone (a traffic window ending).
    pub fn evaluate_with_gates(
        &self,
        crd: &CrdState,
        migrations: &[CompletedMigration],
        gates: &GateInputs,
        at: Timestamp,
    ) -> Evaluation {
        let mut effective = self.clone();
        let mut held: Vec<Blocked> = Vec::new();
        let mut wake_at: Option<Timestamp> = None;
        for version in &self.versions {
            for kind in MilestoneKind::ALL {
                if !version.reached(kind, at) || effect_visible(crd, &version.name, kind) {
                    continue;
                }
                // A `store` superseded by a later one that is also due has no effect.
                if kind == MilestoneKind::Store && self.storage_at(at).is_some_and(|s| s.name != version.name)
                {
                    continue;
                }
                // A transition already applied (the history) passed its gates once: undoing
                // someone's change to it waits only for what keeps objects safe.
                let hold = if gates.applied.contains(&(version.name.clone(), kind)) {
                    migration_gate(&version.name, kind, gates)
                } else {
                    self.gate(version, kind, gates, at, &mut wake_at)
                };
                if let Some((reason, message)) = hold {
                    held.push(Blocked {
                        reason,
                        version: version.name.clone(),
                        milestone: Some(kind),
                        message,
                    });
                    if let Some(v) = effective.versions.iter_mut().find(|v| v.name == version.name) {
                        v.postpone_from(kind);
                    }
                    break;
                }
            }
        }
        // While a `store` is held, the CRD keeps its current storage version: superseded
        // stores do not happen in between either.
        if held.iter().any(|b| b.milestone == Some(MilestoneKind::Store)) {
            for version in &mut effective.versions {
                if version.reached(MilestoneKind::Store, at)
                    && !effect_visible(crd, &version.name, MilestoneKind::Store)
                {
                    version.postpone_only(MilestoneKind::Store);
                }
            }
        }
        // A held `store` (held itself, or behind another held milestone of its version)
        // keeps the previous storage version: it must stay served and present, so its own
        // unserve and remove wait too, for the same reason.
        let waiting_store = self
            .versions
            .iter()
            .filter(|v| v.reached(MilestoneKind::Store, at))
            .filter(|v| {
                effective
                    .version(&v.name)
                    .is_some_and(|e| !e.reached(MilestoneKind::Store, at))
            })
            .find_map(|v| held.iter().find(|b| b.version == v.name).cloned());
        for _ in 0..=self.versions.len() {
            let storage = effective
                .storage_at(at)
                .map(|v| v.name.clone())
                .or_else(|| crd.storage_version().map(str::to_owned));
            let Some(storage) = storage else { break };
            let Some(version) = effective.versions.iter_mut().find(|v| v.name == storage) else {
                break;
            };
            let kind = [MilestoneKind::Unserve, MilestoneKind::Remove]
                .into_iter()
                .find(|k| version.reached(*k, at));
            let Some(kind) = kind else { break };
            version.postpone_from(kind);
            let message = match &waiting_store {
                Some(cause) => format!(
                    "{storage} stays the storage version while {} store waits ({} {} is held), so its {kind} waits",
                    cause.version,
                    cause.version,
                    cause.milestone.map_or("", MilestoneKind::as_str)
                ),
                None => format!("{storage} stays the storage version, so its {kind} waits"),
            };
            held.push(Blocked {
                reason: waiting_store
                    .as_ref()
                    .map_or(BlockReason::UnsafeState, |c| c.reason),
                version: storage.clone(),
                milestone: Some(kind),
                message,
            });
        }
        let mut evaluation = effective.evaluate(crd, migrations, at);
        evaluation.timeline = self.transitions();
        evaluation.blocked.splice(0..0, held);
        evaluation.wake_at = wake_at;
        evaluation
    }

    fn gate(
        &self,
        version: &super::schedule::ScheduledVersion,
        kind: MilestoneKind,
        gates: &GateInputs,
        at: Timestamp,
        wake_at: &mut Option<Timestamp>,
    ) -> Option<(BlockReason, String)> {
        let name = &version.name;
        if version.needs_approval(kind) && !gates.approvals.contains(&(name.clone(), kind)) {
            // Keep the approvals already given: the annotation holds them all.
            let mut value: Vec<String> = gates.approvals.iter().map(|(v, k)| format!("{v}.{k}")).collect();
            value.push(format!("{name}.{kind}"));
            let policy = if gates.policy_name.is_empty() {
                "<name>"
            } else {
                gates.policy_name.as_str()
            };
            return Some((
                BlockReason::AwaitingApproval,
                format!(
                    "{name} {kind} is due and needs approval: kubectl annotate --overwrite versionpolicy {policy} \
                     {APPROVE_ANNOTATION}={}",
                    value.join(",")
                ),
            ));
        }
        if kind == MilestoneKind::Unserve
            && let Some(window) = version.no_traffic_for
        {
            let Some(observed) = gates.traffic.get(name) else {
                return Some((
                    BlockReason::VersionInUse,
                    format!(
                        "{name} unserve waits for {window:#} without requests to {name}; traffic is not observed yet"
                    ),
                ));
            };
            let satisfied_at = observed.quiet_since() + window;
            if satisfied_at > at {
                *wake_at = Some(wake_at.map_or(satisfied_at, |w| w.min(satisfied_at)));
                let last = observed
                    .last_request
                    .map_or_else(|| "none seen".to_owned(), |t| format!("last request seen at {t}"));
                return Some((
                    BlockReason::VersionInUse,
                    format!(
                        "{name} unserve waits for {window:#} without requests to {name} ({last}); satisfied at {satisfied_at} if no request comes"
                    ),
                ));
            }
        }
        if kind == MilestoneKind::Unserve
            && let Some(window) = version.no_writers_for
        {
            let waits = format!(
                "{name} unserve waits until no field manager has written through {name} for {window:#}"
            );
            let writers = match gates.writers.get(name) {
                Some(WritersRead::Read(writers)) => writers,
                Some(WritersRead::Reading { objects }) => {
                    return Some((
                        BlockReason::VersionInUse,
                        format!(
                            "{waits}; reading the objects' managedFields ({objects} objects read so far)"
                        ),
                    ));
                }
                Some(WritersRead::Failed(error)) => {
                    return Some((
                        BlockReason::VersionInUse,
                        format!("{waits}; the objects' managedFields cannot be read ({error}), trying again"),
                    ));
                }
                None => {
                    return Some((
                        BlockReason::VersionInUse,
                        format!("{waits}; the objects' managedFields are not read yet"),
                    ));
                }
            };
            let mut recent: Vec<&(String, Timestamp)> =
                writers.iter().filter(|(_, last)| *last + window > at).collect();
            if !recent.is_empty() {
                recent.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                let satisfied_at = recent.iter().map(|(_, last)| *last + window).max().unwrap_or(at);
                *wake_at = Some(wake_at.map_or(satisfied_at, |w| w.min(satisfied_at)));
                let named: Vec<String> = recent
                    .iter()
                    .map(|(m, last)| format!("{m} (last write {last})"))
                    .collect();
                return Some((
                    BlockReason::VersionInUse,
                    format!(
                        "{waits}: {}; satisfied at {satisfied_at} if nobody writes",
                        named.join(", ")
                    ),
                ));
            }
        }
        if kind == MilestoneKind::Store
            && self.migration.enabled
            && self.migration.preflight
            && let Some(hold) = self.preflight_gate(version, gates, at)
        {
            return Some(hold);
        }
        migration_gate(name, kind, gates)
    }

    /// What holds a `store` of `version` until its conversion preflight stands for it.
    fn preflight_gate(
        &self,
        version: &super::schedule::ScheduledVersion,
        gates: &GateInputs,
        at: Timestamp,
    ) -> Option<(BlockReason, String)> {
        let name = &version.name;
        let store_at = version.at(MilestoneKind::Store).unwrap_or(at);
        match gates.preflight.get(name) {
            Some(PreflightResult::Passed(pass)) if pass.stands(store_at, at) => None,
            Some(PreflightResult::Passed(pass)) if pass.store_at != store_at => Some((
                BlockReason::AwaitingPreflight,
                format!(
                    "{name} store waits for its conversion preflight: the last one through {name} ran for a store at {}, not this one at {store_at}",
                    pass.store_at
                ),
            )),
            Some(PreflightResult::Passed(pass)) => Some((
                BlockReason::AwaitingPreflight,
                format!(
                    "{name} store waits for its conversion preflight's objects to be checked again: they were last checked at {}, more than {:#} before now",
                    pass.checked_at, pass.stands_for
                ),
            )),
            Some(PreflightResult::Failed(message)) => Some((
                BlockReason::ConversionPreflightFailed,
                format!("{name} store is held: reading the objects through {name} failed: {message}"),
            )),
            Some(PreflightResult::Running) | None => Some((
                BlockReason::AwaitingPreflight,
                format!("{name} store waits for the conversion preflight (every object read through {name})"),
            )),
        }
    }
}

/// What holds a `store` while a StorageVersionMigration of the resource is unfinished
/// (`GateInputs::migration_under_way`), whether the store is new or puts back a storage
/// version someone moved.
fn migration_gate(name: &str, kind: MilestoneKind, gates: &GateInputs) -> Option<(BlockReason, String)> {
    let migration = gates
        .migration_under_way
        .as_ref()
        .filter(|_| kind == MilestoneKind::Store)?;
    Some((
        BlockReason::AwaitingMigration,
        format!(
            "{name} store waits until {migration}: a storage switch under a StorageVersionMigration lets it rewrite \
             objects through an apiserver that still stores the version of before, then trim that version from \
             status.storedVersions"
        ),
    ))
}

/// Whether the CRD already shows the effect of a milestone (then no gate applies: it
/// happened, by this controller or by hand).
fn effect_visible(crd: &CrdState, version: &str, kind: MilestoneKind) -> bool {
    let current = crd.version(version);
    match kind {
        MilestoneKind::Introduce => current.is_some_and(|v| v.served),
        MilestoneKind::Store => current.is_some_and(|v| v.storage),
        MilestoneKind::Deprecate => current.is_some_and(|v| v.deprecated),
        MilestoneKind::Unserve => current.is_none_or(|v| !v.served),
        MilestoneKind::Remove => current.is_none(),
    }
}
