//! The conditions of `VersionPolicy.status`, typed: which types a policy reports, why it is
//! held back, and how a condition is written.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::lifecycle::BlockReason;

/// Why a policy is held back, as the `reason` of its `Blocked` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionReason {
    /// The governed CRD does not exist.
    CrdNotFound,
    /// The policy cannot be applied as written (or not to this CRD).
    InvalidPolicy,
    /// An older policy governs the same CRD.
    Conflict,
    /// A removal waits for the CRD's `status.storedVersions` to be trimmed.
    AwaitingMigration,
    /// Applying would break an invariant, or the apiserver rejected the change.
    UnsafeState,
    /// `spec.suspend` is true.
    Suspended,
    /// A due milestone needs an approval annotation.
    AwaitingApproval,
    /// Clients still call a version whose `unserve` has a traffic gate.
    VersionInUse,
    /// A `store` waits for the conversion preflight.
    AwaitingPreflight,
    /// Objects failed to convert to the version a `store` switches to.
    ConversionPreflightFailed,
    /// The policy wants the conversion webhook but this controller does not serve one
    /// (or its certificate is not ready yet).
    WebhookNotConfigured,
    /// The policy is being deleted and its CRD cannot be released yet.
    ReleasingCrd,
    /// A removal waits until no object's managedFields names the version.
    AwaitingManagedFieldsCleanup,
    /// The controller may not do what a migration, preflight or cleanup needs on the
    /// CRD's objects (SelfSubjectAccessReview); nothing was touched.
    MissingPermission,
    /// `spec.migration.engine: StorageVersionMigration`, and the apiserver does not serve
    /// storagemigration.k8s.io.
    StorageVersionMigrationUnavailable,
}

impl ConditionReason {
    pub const ALL: [ConditionReason; 15] = [
        ConditionReason::CrdNotFound,
        ConditionReason::InvalidPolicy,
        ConditionReason::Conflict,
        ConditionReason::AwaitingMigration,
        ConditionReason::UnsafeState,
        ConditionReason::Suspended,
        ConditionReason::AwaitingApproval,
        ConditionReason::VersionInUse,
        ConditionReason::AwaitingPreflight,
        ConditionReason::ConversionPreflightFailed,
        ConditionReason::WebhookNotConfigured,
        ConditionReason::ReleasingCrd,
        ConditionReason::AwaitingManagedFieldsCleanup,
        ConditionReason::MissingPermission,
        ConditionReason::StorageVersionMigrationUnavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ConditionReason::CrdNotFound => "CRDNotFound",
            ConditionReason::InvalidPolicy => "InvalidPolicy",
            ConditionReason::Conflict => "Conflict",
            ConditionReason::AwaitingMigration => "AwaitingMigration",
            ConditionReason::UnsafeState => "UnsafeState",
            ConditionReason::Suspended => "Suspended",
            ConditionReason::AwaitingApproval => "AwaitingApproval",
            ConditionReason::VersionInUse => "VersionInUse",
            ConditionReason::AwaitingPreflight => "AwaitingPreflight",
            ConditionReason::ConversionPreflightFailed => "ConversionPreflightFailed",
            ConditionReason::WebhookNotConfigured => "WebhookNotConfigured",
            ConditionReason::ReleasingCrd => "ReleasingCRD",
            ConditionReason::AwaitingManagedFieldsCleanup => "AwaitingManagedFieldsCleanup",
            ConditionReason::MissingPermission => "MissingPermission",
            ConditionReason::StorageVersionMigrationUnavailable => "StorageVersionMigrationUnavailable",
        }
    }
}

impl ConditionReason {
    /// What it means and what lifts it, for the reference (`docgen`).
    pub fn description(self) -> &'static str {
        match self {
            ConditionReason::CrdNotFound => {
                "The governed CRD does not exist; the policy proceeds once it appears."
            }
            ConditionReason::InvalidPolicy => {
                "The policy cannot be applied as written (or not to this CRD): every problem is listed with its field path, and nothing is applied."
            }
            ConditionReason::Conflict => {
                "An older policy (by creation time, then name) governs the same CRD; this one waits until that one is deleted."
            }
            ConditionReason::AwaitingMigration => {
                "A removal waits for the CRD's `status.storedVersions` to be trimmed, or a `store` or migration waits for an unfinished StorageVersionMigration of the resource. Stalled while migrations are off."
            }
            ConditionReason::UnsafeState => {
                "Applying would break an invariant, or the apiserver rejected the guarded patch of an unchanged CRD (the message quotes it)."
            }
            ConditionReason::Suspended => {
                "`spec.suspend` is true: nothing is changed (neither Stalled nor Reconciling)."
            }
            ConditionReason::AwaitingApproval => {
                "A due milestone has `approval: Required`; the message gives the `kubectl annotate` command that approves it."
            }
            ConditionReason::VersionInUse => {
                "An `unserve` with a traffic or writers gate waits until nobody has called or written through the version for the window."
            }
            ConditionReason::AwaitingPreflight => {
                "A `store` waits for its conversion preflight (running, or to be checked again before the instant)."
            }
            ConditionReason::ConversionPreflightFailed => {
                "Objects failed to read or convert through the version a `store` switches to (the first failures are listed); retried 5 minutes later."
            }
            ConditionReason::WebhookNotConfigured => {
                "The policy enables the conversion webhook, but this controller serves none (or its certificate is not ready yet); `spec.conversion` is left alone."
            }
            ConditionReason::ReleasingCrd => {
                "The policy is being deleted and its CRD cannot be released yet (the conversion record could not be written); retried."
            }
            ConditionReason::AwaitingManagedFieldsCleanup => {
                "A removal waits until no object's managedFields names the version (the cleanup runs in the background)."
            }
            ConditionReason::MissingPermission => {
                "The controller may not do what a migration, preflight or cleanup needs on the CRD's objects (SelfSubjectAccessReview); the message gives the ClusterRole to add, and nothing was touched."
            }
            ConditionReason::StorageVersionMigrationUnavailable => {
                "`spec.migration.engine: StorageVersionMigration`, and the apiserver does not serve storagemigration.k8s.io; checked again every minute."
            }
        }
    }
}

impl ConditionReason {
    /// Whether only a human can lift it: fix the policy or the CRD, approve, resolve the
    /// conflict, fix the objects that do not convert, configure the webhook. A removal
    /// waiting for a migration needs one when migrations are off.
    pub fn needs_a_human(self, migrations_enabled: bool) -> bool {
        match self {
            ConditionReason::CrdNotFound
            | ConditionReason::InvalidPolicy
            | ConditionReason::Conflict
            | ConditionReason::UnsafeState
            | ConditionReason::AwaitingApproval
            | ConditionReason::ConversionPreflightFailed
            | ConditionReason::WebhookNotConfigured
            | ConditionReason::MissingPermission
            | ConditionReason::StorageVersionMigrationUnavailable => true,
            ConditionReason::AwaitingMigration => !migrations_enabled,
            ConditionReason::Suspended
            | ConditionReason::VersionInUse
            | ConditionReason::AwaitingPreflight
            | ConditionReason::ReleasingCrd
            | ConditionReason::AwaitingManagedFieldsCleanup => false,
        }
    }

    /// Whether the operator lifts it by itself in time: a migration, preflight or cleanup
    /// it runs, traffic it watches, a release it retries. (`Suspended` is neither: it
    /// waits for the policy to be resumed.)
    pub fn resolves_by_itself(self, migrations_enabled: bool) -> bool {
        self != ConditionReason::Suspended && !self.needs_a_human(migrations_enabled)
    }
}

impl From<BlockReason> for ConditionReason {
    fn from(reason: BlockReason) -> Self {
        match reason {
            BlockReason::AwaitingMigration => ConditionReason::AwaitingMigration,
            BlockReason::UnsafeState => ConditionReason::UnsafeState,
            BlockReason::AwaitingApproval => ConditionReason::AwaitingApproval,
            BlockReason::VersionInUse => ConditionReason::VersionInUse,
            BlockReason::AwaitingPreflight => ConditionReason::AwaitingPreflight,
            BlockReason::ConversionPreflightFailed => ConditionReason::ConversionPreflightFailed,
            BlockReason::AwaitingManagedFieldsCleanup => ConditionReason::AwaitingManagedFieldsCleanup,
        }
    }
}

/// The reasons of the conditions other than a held-back policy's (`ConditionReason`): what
/// a healthy, working or failed policy reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatusReason {
    /// The CRD is as the policy says now and nothing is pending.
    UpToDate,
    /// `spec.dryRun`: the patch is computed and shown, never applied.
    DryRun,
    /// A migration runs.
    Migrating,
    /// A migration is about to run, or is needed while migrations are off.
    MigrationPending,
    /// The last migration failed.
    MigrationFailed,
    /// The last managedFields cleanup failed.
    ManagedFieldsCleanupFailed,
    /// The CRD does not match the policy yet.
    Pending,
    /// Nothing is under way.
    Idle,
    /// Reconciling is False because the policy is stalled.
    Stalled,
    /// Nothing needs a human.
    NotStalled,
    /// Nothing holds the policy back.
    NotBlocked,
}

impl StatusReason {
    pub const ALL: [StatusReason; 11] = [
        StatusReason::UpToDate,
        StatusReason::DryRun,
        StatusReason::Migrating,
        StatusReason::MigrationPending,
        StatusReason::MigrationFailed,
        StatusReason::ManagedFieldsCleanupFailed,
        StatusReason::Pending,
        StatusReason::Idle,
        StatusReason::Stalled,
        StatusReason::NotStalled,
        StatusReason::NotBlocked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StatusReason::UpToDate => "UpToDate",
            StatusReason::DryRun => "DryRun",
            StatusReason::Migrating => "Migrating",
            StatusReason::MigrationPending => "MigrationPending",
            StatusReason::MigrationFailed => "MigrationFailed",
            StatusReason::ManagedFieldsCleanupFailed => "ManagedFieldsCleanupFailed",
            StatusReason::Pending => "Pending",
            StatusReason::Idle => "Idle",
            StatusReason::Stalled => "Stalled",
            StatusReason::NotStalled => "NotStalled",
            StatusReason::NotBlocked => "NotBlocked",
        }
    }

    /// The conditions that carry it, with their status.
    pub fn carried_by(self) -> &'static [(ConditionType, bool)] {
        match self {
            StatusReason::UpToDate => &[(ConditionType::Ready, true)],
            StatusReason::DryRun => &[(ConditionType::Ready, true), (ConditionType::Reconciling, false)],
            StatusReason::Migrating => &[(ConditionType::Ready, false), (ConditionType::Reconciling, true)],
            StatusReason::MigrationPending => &[
                (ConditionType::Ready, false),
                (ConditionType::Reconciling, true),
                (ConditionType::Reconciling, false),
            ],
            StatusReason::MigrationFailed | StatusReason::ManagedFieldsCleanupFailed => {
                &[(ConditionType::Ready, false), (ConditionType::Stalled, true)]
            }
            StatusReason::Pending => &[(ConditionType::Ready, false), (ConditionType::Reconciling, true)],
            StatusReason::Idle => &[(ConditionType::Reconciling, false)],
            StatusReason::Stalled => &[(ConditionType::Reconciling, false)],
            StatusReason::NotStalled => &[(ConditionType::Stalled, false)],
            StatusReason::NotBlocked => &[(ConditionType::Blocked, false)],
        }
    }

    /// What it means, for the reference (`docgen`).
    pub fn description(self) -> &'static str {
        match self {
            StatusReason::UpToDate => {
                "The policy is idle and healthy: the CRD is as the policy says now, nothing is held back, no migration is due or running."
            }
            StatusReason::DryRun => {
                "`spec.dryRun`: the patch is computed and shown in `status.dryRunPatch`, never applied; a dry run never migrates, so it never waits for one and kstatus settles."
            }
            StatusReason::Migrating => {
                "A migration rewrites the stored objects into the storage version (then trims `status.storedVersions`)."
            }
            StatusReason::MigrationPending => {
                "A migration is about to run (Reconciling True), or `storedVersions` lists old versions while `spec.migration.enabled` is false (Reconciling False: the message says to run `crd-lifecycle migrate`)."
            }
            StatusReason::MigrationFailed => {
                "The last migration failed; it is retried every 5 minutes, but a human must look (objects that do not convert, a missing grant)."
            }
            StatusReason::ManagedFieldsCleanupFailed => {
                "The last managedFields cleanup a removal waits for (or the one after a version is gone) failed after its retries; the message names the objects and the apiserver's answer; retried every 5 minutes."
            }
            StatusReason::Pending => "The CRD does not match the policy yet; the next reconcile applies it.",
            StatusReason::Idle => "No transition or migration is under way.",
            StatusReason::Stalled => "The policy is stalled: see the Stalled condition.",
            StatusReason::NotStalled => "Nothing needs a human.",
            StatusReason::NotBlocked => "Nothing holds the policy back.",
        }
    }
}

/// The condition types a policy reports (kstatus reads `Ready`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionType {
    /// The policy is idle and healthy: the CRD is as the policy says, nothing is held back,
    /// no migration is due or running (`kubectl wait --for=condition=Ready`).
    Ready,
    /// kstatus: the operator is still working towards Ready.
    Reconciling,
    /// kstatus: the operator cannot go on without a human.
    Stalled,
    /// Something holds the policy back; the reason says what.
    Blocked,
}

impl ConditionType {
    pub const ALL: [ConditionType; 4] = [
        ConditionType::Ready,
        ConditionType::Reconciling,
        ConditionType::Stalled,
        ConditionType::Blocked,
    ];

    /// What the condition says, for the reference (`docgen`).
    pub fn description(self) -> &'static str {
        match self {
            ConditionType::Ready => {
                "True only when the policy is idle and healthy (`kubectl wait --for=condition=Ready vp/NAME` waits for it); else False with the reason that keeps it from being so."
            }
            ConditionType::Reconciling => {
                "kstatus: True while the operator works towards Ready by itself (a migration, a wait it lifts itself, a pending patch). It replaces the former `Progressing` condition."
            }
            ConditionType::Stalled => {
                "kstatus: True when only a human can move the policy on. `Suspended` is neither Stalled nor Reconciling."
            }
            ConditionType::Blocked => {
                "True with the first reason and every message while something holds the policy back."
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::Ready => "Ready",
            ConditionType::Reconciling => "Reconciling",
            ConditionType::Stalled => "Stalled",
            ConditionType::Blocked => "Blocked",
        }
    }
}

/// One condition as a reconcile decides it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionState {
    pub type_: ConditionType,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl ConditionState {
    pub fn new(type_: ConditionType, status: bool, reason: &str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }

    /// The condition as written: its transition time is kept from `previous` when its type,
    /// status and reason are the same, so that an unchanged situation writes an identical
    /// status.
    pub fn condition(self, previous: &[Condition], generation: Option<i64>, now: Timestamp) -> Condition {
        let status = if self.status { "True" } else { "False" };
        let unchanged = previous
            .iter()
            .find(|c| c.type_ == self.type_.as_str() && c.status == status && c.reason == self.reason);
        Condition {
            last_transition_time: unchanged.map_or(Time(now), |c| c.last_transition_time.clone()),
            message: self.message,
            observed_generation: generation,
            reason: self.reason,
            status: status.to_owned(),
            type_: self.type_.as_str().to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason a condition is written with comes from `ConditionReason` or
    /// `StatusReason` (so the generated reference lists it): no string literal is passed to
    /// `ConditionState::new` where conditions are decided.
    #[test]
    fn every_reason_written_is_a_declared_one() {
        for (file, source) in [
            ("status/kstatus.rs", include_str!("status/kstatus.rs")),
            (
                "reconcile/undecodable.rs",
                include_str!("reconcile/undecodable.rs"),
            ),
        ] {
            for call in source.split("ConditionState::new(").skip(1) {
                // The reason is the third argument; a literal there starts with a quote.
                let reason = call.split(',').nth(2).unwrap_or_default().trim();
                assert!(
                    !reason.starts_with('"'),
                    "{file}: a condition reason written as a literal: {reason}"
                );
            }
        }
    }

    #[test]
    fn reasons_are_unique() {
        let mut names: Vec<&str> = ConditionReason::ALL.map(ConditionReason::as_str).to_vec();
        names.extend(StatusReason::ALL.map(StatusReason::as_str));
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "a reason declared twice");
    }
}
