//! `VersionPolicy.status`: written by the controller with server-side apply.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::MilestoneKind;

/// What the controller last observed and did for this policy.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionPolicyStatus {
    /// The `metadata.generation` of the policy this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// kstatus-compatible: `Ready` (idle and healthy: the CRD is as the policy says, no
    /// migration due or running), `Reconciling` (the operator still works towards Ready),
    /// `Stalled` (a human must act: invalid policy, approval, conflict, failed migration) and
    /// `Blocked` (every reason that holds the policy back).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The CRD's storage version as last observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_version: Option<String>,

    /// The state of each version of the CRD.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<VersionStatus>,

    /// The next scheduled transition, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_transition: Option<NextTransition>,

    /// Transitions applied to the CRD, newest last (bounded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,

    /// With `spec.dryRun`, the JSON Patch that would have been applied to the CRD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run_patch: Option<String>,

    /// Progress of the storage-version migration of the CRD's objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationStatus>,

    /// Progress of the rewrite of objects' `metadata.managedFields` entries that name a
    /// version about to be removed (a removal waits for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_fields_cleanup: Option<MigrationStatus>,

    /// The conversion preflight of each version a `store` switches to (every object read
    /// through it), one entry per version, each written by its own field manager
    /// (`crd-lifecycle-preflight-<version>`), so that preflights of several stores never
    /// overwrite each other.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["version"]))]
    pub preflights: Vec<PreflightStatus>,

    /// Deprecated: the single preflight result releases before `preflights` wrote. Read for
    /// its version until `preflights` has an entry for it, then cleared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight: Option<PreflightStatus>,

    /// Client requests observed for versions whose `unserve` has a traffic gate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traffic: Vec<TrafficStatus>,
}

/// A conversion preflight.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreflightStatus {
    /// The version objects were read through.
    pub version: String,
    /// Running, Succeeded or Failed.
    pub phase: MigrationPhase,
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// The instant of the `store` it ran for: the result stands for that store only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_at: Option<Time>,
    /// Objects the result covers: those the preflight read, or those found at the last
    /// check before the store (`verifiedAt`).
    #[serde(default)]
    pub read: u64,
    /// A digest of the objects the result covers (names and resourceVersions), as found by
    /// the preflight or its last check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects_digest: Option<String>,
    /// A fingerprint of what the objects were checked against: the CRD's conversion and the
    /// schema of `version`. The result stands only while the CRD's is the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Deprecated (written by earlier releases instead of `fingerprint`): a fingerprint of
    /// the CRD's conversion alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversion: Option<String>,
    /// When the last check before the store started: the objects were listed again and
    /// those created or changed since the preflight read them were read, converted and
    /// checked the same way. At the store's instant a passed result stands only if it
    /// finished, or was checked, shortly before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<Time>,
    /// Objects that failed to convert.
    #[serde(default)]
    pub failed: u64,
    /// The first failures, as `namespace/name: message`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    /// A human-readable summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What the controller saw of the requests to one version.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrafficStatus {
    /// The version.
    pub version: String,
    /// Since when requests to it are observed (this controller's start, at the earliest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_since: Option<Time>,
    /// The last sample in which requests to it had happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_request_at: Option<Time>,
    /// When the required quiet window is complete if no request comes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_satisfied_at: Option<Time>,
    /// Why traffic cannot be observed, if it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where a version is in its life.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum VersionPhase {
    /// Not yet introduced: present in the CRD but not served.
    Pending,
    /// Served, not the storage version, not deprecated.
    Served,
    /// The storage version.
    Stored,
    /// Served and deprecated.
    Deprecated,
    /// Present in the CRD but no longer served.
    Unserved,
    /// Gone from the CRD.
    Removed,
}

impl std::fmt::Display for VersionPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// The state of one version of the CRD.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionStatus {
    /// The version's name.
    pub name: String,
    /// Where the version is in its life.
    pub phase: VersionPhase,
    /// Whether the version is served.
    pub served: bool,
    /// Whether the version is the storage version.
    pub storage: bool,
    /// Whether the version is deprecated.
    pub deprecated: bool,
    /// When the policy last changed this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
}

/// A scheduled transition.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NextTransition {
    /// The version the transition applies to.
    pub version: String,
    /// The milestone.
    pub milestone: MilestoneKind,
    /// When it is scheduled.
    pub at: Time,
    /// One line for `kubectl get`, e.g. `v1alpha1 unserve 2026-05-30T00:00:00Z`.
    pub summary: String,
}

/// A transition the controller applied to the CRD.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// The version the transition applied to.
    pub version: String,
    /// The milestone.
    pub milestone: MilestoneKind,
    /// When it was scheduled.
    pub scheduled_at: Time,
    /// When the CRD was patched.
    pub applied_at: Time,
    /// Who approved it (the field manager that set the approval annotation), for
    /// milestones that needed an approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// When the approval annotation was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_at: Option<Time>,
}

/// Where a storage-version migration is.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MigrationPhase {
    /// Objects are being rewritten.
    Running,
    /// Every object was rewritten and `status.storedVersions` was trimmed.
    Succeeded,
    /// Some objects could not be rewritten; `status.storedVersions` was left as it was.
    Failed,
}

/// Progress of the storage-version migration.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStatus {
    /// Running, Succeeded or Failed.
    pub phase: MigrationPhase,
    /// The storage version objects are rewritten into.
    pub storage_version: String,
    /// For a managedFields cleanup: the versions whose entries it rewrites.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<String>,
    /// For a managedFields cleanup: the versions the CRD no longer has that this cleanup
    /// rewrites (or an earlier one rewrote) once no apiserver served them. Once it
    /// succeeded, none of them is cleaned again while it stays gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gone_versions: Vec<String>,
    /// The CRD generation the run started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crd_generation: Option<i64>,
    /// When the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Objects listed so far.
    #[serde(default)]
    pub listed: u64,
    /// Objects rewritten so far.
    #[serde(default)]
    pub rewritten: u64,
    /// Objects that needed no rewrite (changed or deleted since they were listed).
    #[serde(default)]
    pub skipped: u64,
    /// Objects that could not be rewritten.
    #[serde(default)]
    pub failed: u64,
    /// Objects the run expects in all (counted by a full list when it starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    /// Objects done of all, e.g. `3120/10000` (`kubectl get` shows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Where a restarted controller resumes this run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<MigrationCheckpoint>,
    /// The first failures, as `namespace/name: message`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
    /// A human-readable summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// With `spec.migration.engine: StorageVersionMigration`: the StorageVersionMigration
    /// the built-in migrator runs (storagemigration.k8s.io).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_version_migration: Option<String>,
    /// Whether the run listed every object and rewrote each into the storage version (or
    /// Kubernetes' migrator did). False for a run that found `status.storedVersions`
    /// already trimmed and rewrote nothing: only a run that rewrote every object releases
    /// a failed StorageVersionMigration's hold on removals.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rewrote_all: bool,
    /// The UIDs of the failed StorageVersionMigrations of the resource whose end (and with
    /// it Kubernetes' trim of `status.storedVersions`) was processed before this run listed
    /// its first object. A run that rewrote every object releases their hold on removals,
    /// and only theirs: a failure processed later may have trimmed a version whose objects
    /// it never saw.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covers_failed_migrations: Vec<String>,
    /// The CRD's record of a failed StorageVersionMigration (its condition `StorageMigrating`
    /// with reason `MigrationFailed`: its time and message) as this run read it
    /// before it listed its first object. While the CRD shows another such record, no run
    /// covers that failure, and every version is listed in `status.storedVersions` again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub covers_failed_migration_on_crd: Option<String>,
}

impl MigrationStatus {
    /// Whether this run succeeded while the CRD was at `generation`. A managedFields
    /// cleanup counts only there: a spec change since may have served a version it cleaned
    /// again, and clients may have named it again meanwhile.
    pub fn succeeded_at(&self, generation: Option<i64>) -> bool {
        self.phase == MigrationPhase::Succeeded
            && self.crd_generation.is_some()
            && self.crd_generation == generation
    }

    /// A run that starts now (or started at `started_at`) towards `storage_version`,
    /// nothing counted yet.
    pub fn running(storage_version: &str, started_at: Time) -> MigrationStatus {
        MigrationStatus {
            phase: MigrationPhase::Running,
            storage_version: storage_version.to_owned(),
            versions: Vec::new(),
            crd_generation: None,
            started_at: Some(started_at),
            finished_at: None,
            listed: 0,
            rewritten: 0,
            skipped: 0,
            failed: 0,
            total: None,
            progress: None,
            checkpoint: None,
            failures: Vec::new(),
            message: None,
            storage_version_migration: None,
            rewrote_all: false,
            covers_failed_migrations: Vec::new(),
            covers_failed_migration_on_crd: None,
            gone_versions: Vec::new(),
        }
    }
}

/// Where an interrupted migration resumes: valid only while the CRD still has the
/// storage version and conversion it names and had that storage version all along since
/// the run started (watched from `crdResourceVersion`), otherwise a fresh run starts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationCheckpoint {
    /// List continue token after the last page whose objects are all done (a page with a
    /// failed object holds it, so a resume processes that object again).
    pub continue_token: String,
    /// The CRD generation the checkpointed run started at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crd_generation: Option<i64>,
    /// The CRD resourceVersion the checkpointed run started at: a resumed run replays the
    /// CRD's history from it, so that a storage change while no leader watched is seen (if
    /// that history is compacted away, a changed generation starts a fresh run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crd_resource_version: Option<String>,
    /// The storage version objects were rewritten into.
    pub storage_version: String,
    /// A fingerprint of the conversion the rewrites went through (a resume needs the same).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub conversion: String,
    /// Objects listed before the token.
    #[serde(default)]
    pub listed: u64,
    /// Objects rewritten before the token.
    #[serde(default)]
    pub rewritten: u64,
    /// Objects skipped (changed or deleted since listed) before the token.
    #[serde(default)]
    pub skipped: u64,
}
