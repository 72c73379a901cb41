//! The `VersionPolicy` custom resource (`crdlifecycle.io/v1alpha1`).
//!
//! Doc comments on these types become the CRD's OpenAPI descriptions, and so the
//! text of `kubectl explain versionpolicy.spec`.

mod status;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use status::*;

/// API group of every resource this operator defines.
pub const GROUP: &str = "crdlifecycle.io";

/// Field manager used for every write this operator makes.
pub const FIELD_MANAGER: &str = "crd-lifecycle";

/// Longest list of governed versions (also bounds the cost of the CEL rules).
pub const MAX_VERSIONS: usize = 64;

/// Schedules the life of one CustomResourceDefinition's versions: when each version is
/// introduced (served), becomes the storage version, is deprecated, stops being served
/// and is removed.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "crdlifecycle.io",
    version = "v1alpha1",
    kind = "VersionPolicy",
    doc = "Schedules the life of one CustomResourceDefinition's versions.",
    plural = "versionpolicies",
    shortname = "vp",
    status = "VersionPolicyStatus",
    printcolumn = r#"{"name":"CRD","type":"string","jsonPath":".spec.crdName"}"#,
    printcolumn = r#"{"name":"Storage","type":"string","jsonPath":".status.storageVersion"}"#,
    printcolumn = r#"{"name":"Migration","type":"string","jsonPath":".status.migration.progress"}"#,
    printcolumn = r#"{"name":"Next","type":"string","jsonPath":".status.nextTransition.summary"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Blocked","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Blocked\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VersionPolicySpec {
    /// Name of the CustomResourceDefinition this policy governs, e.g. `widgets.example.com`.
    /// Immutable: create a new VersionPolicy to govern another CRD.
    #[schemars(
        length(min = 1, max = 253),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("crdName is immutable; create a new VersionPolicy instead"))]
    pub crd_name: String,

    /// While true the controller changes nothing and reports the policy as Suspended. (A CRD
    /// pointed at the operator's webhook still gets the webhook's new CA in its `caBundle`
    /// when the CA rotates.)
    #[serde(default, skip_serializing_if = "is_false")]
    pub suspend: bool,

    /// While true the controller computes and reports what it would change (in
    /// `status.dryRunPatch`) but never patches the CRD.
    #[serde(default, skip_serializing_if = "is_false")]
    pub dry_run: bool,

    /// The versions this policy governs, each with its milestones. Versions of the CRD not
    /// listed here keep their `served`, `deprecated` and `deprecationWarning` flags; their
    /// `storage` flag is cleared when a governed version becomes the storage version.
    #[schemars(length(min = 1, max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(validation = Rule::new("size(self) > 0").message("at least one version must be listed"))]
    #[x_kube(validation = Rule::new("self.all(v, self.exists_one(w, w.name == v.name))").message("version names must be unique"))]
    pub versions: Vec<VersionSchedule>,

    /// How objects are rewritten into a new storage version after a `store` transition.
    #[serde(default)]
    pub migration: MigrationSettings,

    /// `KubernetesDeprecationPolicy`: also reject schedules that break the Kubernetes API
    /// deprecation policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforce: Option<Enforce>,

    /// Declarative conversion between adjacent versions, served by the operator's
    /// conversion webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversion: Option<ConversionSpec>,
}

/// How objects convert between the CRD's versions.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConversionSpec {
    /// The operator's conversion webhook.
    #[serde(default)]
    pub webhook: ConversionWebhook,

    /// What changes between adjacent versions, oldest to newest; converting across
    /// several versions chains these steps up or down.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub changes: Vec<ConversionStep>,
}

/// The operator's conversion webhook for the CRD.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConversionWebhook {
    /// Point the CRD's `spec.conversion` at the operator's webhook (strategy Webhook).
    #[serde(default)]
    pub enabled: bool,
}

/// The changes from one version to the next.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConversionStep {
    /// The older version.
    pub from: String,
    /// The next version.
    pub to: String,
    /// Fields that moved: dotted paths inside the object, e.g. `spec.size` → `spec.replicas`.
    /// A path may reach into the items of a list: `spec.ports[].name` (items matched by
    /// position) or `spec.ports[port].name` (by the values of their `port`, as a list with
    /// `x-kubernetes-list-map-keys` must be).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub renamed: Vec<RenamedField>,
    /// Fields the newer version adds, with the value they take when converting up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<AddedField>,
    /// Fields the newer version no longer has (kept in an annotation, restored going back).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Fields whose type or values change, converted with CEL expressions (after renames:
    /// name the field's path in the newer version).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<ChangedField>,
    /// Fields whose loss between these versions is accepted on purpose: one version has
    /// them and the other does not (or not with that type), and no rule converts them, so
    /// the apiserver prunes them. Shown by `plan`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accept_loss: Vec<AcceptedLoss>,
}

/// A field whose loss between two versions is accepted on purpose.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AcceptedLoss {
    /// Its path in either version, e.g. `spec.legacy`; fields below it are included.
    pub path: String,
    /// Why losing it is fine, for the people who read the plan.
    #[schemars(length(min = 1, max = 256))]
    pub reason: String,
}

/// A field whose type or values change between two versions, e.g. a port that was a string
/// and becomes an integer. A missing field stays missing; a value the round trip would not
/// give back, either way (`downgrade(upgrade(x)) != x`, e.g. `"08080"`, or
/// `upgrade(downgrade(x)) != x`), is kept in an annotation, apart from what `acceptLoss`
/// names.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ChangedField {
    /// Its path in the newer version, e.g. `spec.port`.
    pub path: String,
    /// CEL: `self` is the value in the older version, the result the value in the newer,
    /// e.g. `int(self)`.
    #[schemars(length(min = 1, max = 1024))]
    pub upgrade: String,
    /// CEL: `self` is the value in the newer version, the result the value in the older,
    /// e.g. `string(self)`.
    #[schemars(length(min = 1, max = 1024))]
    pub downgrade: String,
}

/// A field that moved between two versions.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RenamedField {
    /// Its path in the older version, e.g. `spec.size`.
    pub from: String,
    /// Its path in the newer version, e.g. `spec.scale.replicas`.
    pub to: String,
}

/// A field a newer version adds.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AddedField {
    /// Its path, e.g. `spec.color`.
    pub path: String,
    /// The value it takes when an object converts up (any JSON value).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub default: serde_json::Value,
}

/// The milestones of one version. Every milestone is optional; those given must be in the
/// order introduce, store, deprecate, unserve, remove (equal instants are allowed).
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct VersionSchedule {
    /// The version's name as in the CRD's `spec.versions[].name`, e.g. `v1beta1`.
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,

    /// When the version starts being served. Before it the version has `served: false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub introduce: Option<Milestone>,

    /// When the version becomes the storage version (the one objects are written in).
    /// Stored objects are then migrated into it, if migration is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<Milestone>,

    /// When the version is marked deprecated; clients then get a warning on every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecate: Option<DeprecateMilestone>,

    /// When the version stops being served (`served: false`). Requires an earlier or
    /// equal `deprecate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unserve: Option<UnserveMilestone>,

    /// When the version is deleted from the CRD's `spec.versions`. Requires an earlier or
    /// equal `unserve`, and is held back while the version is listed in the CRD's
    /// `status.storedVersions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove: Option<Milestone>,
}

/// When a milestone happens: exactly one of `at` or `after`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.at) != has(self.after)").message("exactly one of at or after must be set"))]
pub struct Milestone {
    /// An RFC 3339 instant, e.g. `2026-03-01T00:00:00Z`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub at: Option<String>,

    /// A duration after the scheduled instant of this version's previous milestone that
    /// has one (order: introduce, store, deprecate, unserve, remove), e.g. `90d`, `1d12h`,
    /// `30m`. Units: d, h, m, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]+[dhms])+$"))]
    pub after: Option<String>,

    /// `Required`: when due, the milestone waits until approved with
    /// `kubectl annotate vp NAME crdlifecycle.io/approve=<version>.<milestone>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
}

/// When a version stops being served, and what must hold first.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.at) != has(self.after)").message("exactly one of at or after must be set"))]
pub struct UnserveMilestone {
    /// An RFC 3339 instant, e.g. `2026-03-01T00:00:00Z`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub at: Option<String>,

    /// A duration after the scheduled instant of this version's previous milestone that
    /// has one, e.g. `90d`. Units: d, h, m, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]+[dhms])+$"))]
    pub after: Option<String>,

    /// `Required`: when due, the milestone waits for an approval annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,

    /// Traffic gate: the version stops being served only once the controller has observed
    /// no client request to it (apiserver `/metrics`) for this long, e.g. `24h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]+[dhms])+$"))]
    pub require_no_traffic_for: Option<String>,

    /// Writers gate: the version stops being served only once no field manager has written
    /// through it for this long, according to its objects' `metadata.managedFields`
    /// (`7d` is a good window). Needs no access to the apiserver's metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]+[dhms])+$"))]
    pub require_no_writers_for: Option<String>,
}

/// Whether a milestone needs a human's approval. `Required`: when due, the milestone waits
/// until approved with `kubectl annotate --overwrite vp NAME
/// crdlifecycle.io/approve=<version>.<milestone>` (comma-separated entries accumulate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Approval {
    /// The milestone waits for the approval annotation.
    Required,
}

/// Extra rules the policy's schedule must follow. `KubernetesDeprecationPolicy`: also reject
/// schedules that break the Kubernetes API deprecation policy: no deprecation unless a newer
/// version at least as stable is served then, a beta version served 9 months after its
/// deprecation, a GA version never removed (version names that are not Kubernetes-style are
/// exempt).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Enforce {
    /// The Kubernetes API deprecation policy: no deprecation in favour of a less stable
    /// version, beta versions served 9 months after deprecation, GA versions never removed.
    KubernetesDeprecationPolicy,
}

/// When a version is deprecated, and the warning clients get.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.at) != has(self.after)").message("exactly one of at or after must be set"))]
pub struct DeprecateMilestone {
    /// An RFC 3339 instant, e.g. `2026-03-01T00:00:00Z`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub at: Option<String>,

    /// A duration after the scheduled instant of this version's previous milestone that
    /// has one, e.g. `30d`. Units: d, h, m, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]+[dhms])+$"))]
    pub after: Option<String>,

    /// The `deprecationWarning` set on the version: not empty, at most 256 bytes of UTF-8
    /// (tighter than the 256 characters of its length bound: 128 × "é" is the most),
    /// printable characters only (letters, marks, numbers, punctuation, symbols and the
    /// ASCII space; no non-breaking or zero-width spaces, soft hyphens or other format
    /// characters, nothing newer than Unicode 13). When unset the apiserver's default
    /// warning is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), pattern(r"^[\p{L}\p{M}\p{N}\p{P}\p{S} ]+$"))]
    #[x_kube(validation = Rule::new("size(bytes(self)) <= 256").message("warning must be at most 256 bytes of UTF-8"))]
    pub warning: Option<String>,

    /// `Required`: when due, the milestone waits for an approval annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
}

/// Settings of the storage-version migration that follows a `store` transition.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MigrationSettings {
    /// Rewrite every stored object into the new storage version and then trim the CRD's
    /// `status.storedVersions`. Without it, removals wait until someone runs
    /// `crd-lifecycle migrate`.
    #[serde(default = "default_true")]
    pub enabled: bool,

    /// How many rewrite requests may be in flight at once.
    #[serde(default = "default_concurrency")]
    #[schemars(range(min = 1, max = 256))]
    pub concurrency: u32,

    /// How many objects each list request returns.
    #[serde(default = "default_page_size")]
    #[schemars(range(min = 1, max = 10000))]
    pub page_size: u32,

    /// Client-side limit on requests per second; 0 means no limit.
    #[serde(default)]
    #[schemars(range(min = 0, max = 10000))]
    pub qps: u32,

    /// Conversion preflight: before a `store` transition, read every object through the
    /// new storage version; any failure holds the switch. Only with `enabled`.
    #[serde(default = "default_true")]
    pub preflight: bool,

    /// How long before a `store`'s instant its conversion preflight starts (a duration such
    /// as `15m`), so that the store lands on its instant. Unset: derived from the CRD's
    /// object count and the rate its last preflight read at, at least one minute. The check
    /// shortly before the instant is sized by the object count either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preflight_lead: Option<String>,

    /// Where the no-op rewrite goes: `status` sends it to the `/status` subresource (which
    /// also stores the whole object in the storage version), for CRDs whose admission
    /// webhooks reject writes of the main resource. The storage version needs a status
    /// subresource. Unset: the main resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subresource: Option<RewriteSubresource>,

    /// Who rewrites the objects: `Internal` (the operator's own migrator, default) or
    /// `StorageVersionMigration` (Kubernetes' built-in migrator, storagemigration.k8s.io,
    /// beta and off by default in 1.35-1.36: the operator creates a
    /// StorageVersionMigration and follows it).
    #[serde(default, skip_serializing_if = "is_internal")]
    pub engine: MigrationEngine,
}

/// Who rewrites a CRD's objects into a new storage version.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
pub enum MigrationEngine {
    /// The operator's own migrator.
    #[default]
    Internal,
    /// Kubernetes' built-in StorageVersionMigration (kube-controller-manager's `svm`
    /// controller).
    StorageVersionMigration,
}

impl MigrationEngine {
    pub fn as_str(self) -> &'static str {
        match self {
            MigrationEngine::Internal => "Internal",
            MigrationEngine::StorageVersionMigration => "StorageVersionMigration",
        }
    }
}

fn is_internal(engine: &MigrationEngine) -> bool {
    *engine == MigrationEngine::Internal
}

/// A subresource the migrator's rewrites can go through. `status`: the no-op rewrite goes to
/// the `/status` subresource (which also stores the whole object in the storage version),
/// for CRDs whose admission webhooks reject writes of the main resource; the storage version
/// needs a status subresource. Unset: the main resource.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RewriteSubresource {
    /// `/status`.
    Status,
}

impl Default for MigrationSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            concurrency: default_concurrency(),
            page_size: default_page_size(),
            qps: 0,
            preflight: true,
            preflight_lead: None,
            subresource: None,
            engine: MigrationEngine::Internal,
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_concurrency() -> u32 {
    16
}

fn default_page_size() -> u32 {
    500
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The kinds of milestone, in the order they must happen for one version.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum MilestoneKind {
    /// The version starts being served.
    Introduce,
    /// The version becomes the storage version.
    Store,
    /// The version is marked deprecated.
    Deprecate,
    /// The version stops being served.
    Unserve,
    /// The version is deleted from the CRD.
    Remove,
}

impl MilestoneKind {
    /// Every kind, in lifecycle order.
    pub const ALL: [MilestoneKind; 5] = [
        MilestoneKind::Introduce,
        MilestoneKind::Store,
        MilestoneKind::Deprecate,
        MilestoneKind::Unserve,
        MilestoneKind::Remove,
    ];

    /// The field name used in the policy (`introduce`, `store`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            MilestoneKind::Introduce => "introduce",
            MilestoneKind::Store => "store",
            MilestoneKind::Deprecate => "deprecate",
            MilestoneKind::Unserve => "unserve",
            MilestoneKind::Remove => "remove",
        }
    }
}

impl std::fmt::Display for MilestoneKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl VersionSchedule {
    /// Whether the milestone of the given kind needs an approval.
    pub fn needs_approval(&self, kind: MilestoneKind) -> bool {
        let approval = match kind {
            MilestoneKind::Introduce => self.introduce.as_ref().and_then(|m| m.approval),
            MilestoneKind::Store => self.store.as_ref().and_then(|m| m.approval),
            MilestoneKind::Deprecate => self.deprecate.as_ref().and_then(|m| m.approval),
            MilestoneKind::Unserve => self.unserve.as_ref().and_then(|m| m.approval),
            MilestoneKind::Remove => self.remove.as_ref().and_then(|m| m.approval),
        };
        approval == Some(Approval::Required)
    }

    /// The `at` / `after` of the milestone of the given kind, if the policy sets it.
    pub fn timing(&self, kind: MilestoneKind) -> Option<(Option<&str>, Option<&str>)> {
        fn pair<'a>(at: &'a Option<String>, after: &'a Option<String>) -> (Option<&'a str>, Option<&'a str>) {
            (at.as_deref(), after.as_deref())
        }
        match kind {
            MilestoneKind::Introduce => self.introduce.as_ref().map(|m| pair(&m.at, &m.after)),
            MilestoneKind::Store => self.store.as_ref().map(|m| pair(&m.at, &m.after)),
            MilestoneKind::Deprecate => self.deprecate.as_ref().map(|m| pair(&m.at, &m.after)),
            MilestoneKind::Unserve => self.unserve.as_ref().map(|m| pair(&m.at, &m.after)),
            MilestoneKind::Remove => self.remove.as_ref().map(|m| pair(&m.at, &m.after)),
        }
    }
}

/// Formats the apiserver knows for integers (kube-openapi's validate and strfmt: `int32`,
/// `int64`; v1.36 warns "unrecognized format" for others, apiserver-samples/34).
pub const KNOWN_INTEGER_FORMATS: [&str; 2] = ["int32", "int64"];

/// The VersionPolicy CRD, as `crd-lifecycle crd` prints it and as it is installed: schemars
/// gives unsigned fields `format: uint32` / `uint64`, which the apiserver does not know
/// (v1.36 prints a warning for each, sample 34); they become `int64` (their `minimum: 0`
/// stays, and every value they take fits).
pub fn versionpolicy_crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    let mut crd = VersionPolicy::crd();
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            known_formats_only(schema);
        }
    }
    crd
}

fn known_formats_only(
    schema: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps,
) {
    if schema.type_.as_deref() == Some("integer")
        && schema
            .format
            .as_deref()
            .is_some_and(|format| !KNOWN_INTEGER_FORMATS.contains(&format))
    {
        schema.format = Some("int64".to_owned());
    }
    for child in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        known_formats_only(child);
    }
    if let Some(
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(
            items,
        ),
    ) = schema.items.as_mut()
    {
        known_formats_only(items);
    }
    if let Some(
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrBool::Schema(
            values,
        ),
    ) = schema.additional_properties.as_mut()
    {
        known_formats_only(values);
    }
}

/// The VersionPolicy CRD as YAML.
pub fn versionpolicy_crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(&versionpolicy_crd())
}
