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
