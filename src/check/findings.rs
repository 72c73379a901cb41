//! What applying an incoming CRD to a cluster would do, from plain data: the incoming CRD,
//! the live one and what was read of its objects (pure).
//!
//! Three severities: `Rejected` (the apiserver refuses the apply), `Breaking` (the apply
//! succeeds but breaks clients or loses data) and `Info` (what changes).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use serde::Serialize;
use serde_json::Value;

use crate::lifecycle::apiserver_rules;
use crate::schema::{self, Schema};

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Severity {
    /// The apiserver refuses the apply.
    Rejected,
    /// The apply succeeds, but clients break or data is lost.
    Breaking,
    /// What the apply changes.
    Info,
}

/// A field manager's last write through a version (from the objects' managedFields).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagerWrite {
    pub manager: String,
    pub version: String,
    /// The newest `time` of its entries naming the version (`None` where no entry has one).
    pub last_write: Option<Timestamp>,
}

/// An object that fails the incoming schema, where and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectProblem {
    /// `namespace/name`, or `name` for a cluster-scoped object.
    pub object: String,
    /// The field path, e.g. `spec.replicas`.
    pub path: String,
    pub message: String,
}

/// What `check --fix` does about a finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum FixStep {
    /// Move the storage version back to `to` (served), from `from`, with a guarded patch.
    #[serde(rename_all = "camelCase")]
    Rollback { from: String, to: String },
    /// Rewrite every object into the storage version `into`, then trim
    /// `status.storedVersions` to it.
    #[serde(rename_all = "camelCase")]
    Migrate { into: String },
    /// Rewrite the managedFields entries naming `versions` into the storage version.
    #[serde(rename_all = "camelCase")]
    CleanManagedFields { versions: Vec<String> },
}

impl FixStep {
    /// `Migrate v1`, `Rollback v2 -> v1`, `CleanManagedFields v1beta1`.
    pub fn label(&self) -> String {
        match self {
            FixStep::Rollback { from, to } => format!("Rollback {from} -> {to}"),
            FixStep::Migrate { into } => format!("Migrate {into}"),
            FixStep::CleanManagedFields { versions } => format!("CleanManagedFields {}", versions.join(",")),
        }
    }
}

/// One finding about one incoming CRD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub severity: Severity,
    /// A stable name of the kind of finding (`StoredVersionMissing`, ...; docs/src/guides/upgrade-check.md).
    pub kind: &'static str,
    /// The version it is about, if one.
    pub version: Option<String>,
    pub message: String,
    /// The objects it concerns, where it is about objects.
    pub objects: Option<u64>,
    /// Field managers, with their last write.
    pub managers: Vec<ManagerWrite>,
    /// The first objects that fail the incoming schema.
    pub invalid_objects: Vec<ObjectProblem>,
    /// Field paths (pruned fields of a storage switch without conversion).
    pub fields: Vec<String>,
    /// What `check --fix` does about it; `None` where it does nothing.
    pub fix: Option<FixStep>,
}

impl Finding {
    fn new(severity: Severity, kind: &'static str, version: Option<&str>, message: String) -> Finding {
        Finding {
            severity,
            kind,
            version: version.map(str::to_owned),
            message,
            objects: None,
            managers: Vec::new(),
            invalid_objects: Vec::new(),
            fields: Vec::new(),
            fix: None,
        }
    }
}

/// Objects checked against the incoming schema of one version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Validated {
    /// The version objects were read through and checked against.
    pub version: String,
    /// Objects read.
    pub checked: u64,
    /// Objects with at least one problem.
    pub invalid: u64,
    /// The first problems (at most one per object).
    pub first: Vec<ObjectProblem>,
}

/// The VersionPolicy that governs a live CRD.
#[derive(Clone, Debug, PartialEq)]
pub struct Governing {
    pub name: String,
    pub suspended: bool,
    /// Its last completed migration's rate (objects per second), if it has one.
    pub rate: Option<f64>,
    /// A migration of its own is running now.
    pub migrating: bool,
    /// Its declarative conversion (translates managedFields paths in a cleanup).
    pub conversion: Option<crate::api::ConversionSpec>,
}

/// One cause of the apiserver's refusal (`details.causes[]` of its 422).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// The field path, e.g. `status.storedVersions[0]`.
    pub field: String,
    /// The apiserver's words, e.g. `Invalid value: "v1beta1": must appear in spec.versions`.
    pub message: String,
}

/// What was read of one CRD on one cluster.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The live CRD; `None` where it does not exist.
    pub live: Option<CustomResourceDefinition>,
    /// The apiserver's answer to a dry run (`dryRun=All`) of updating the live CRD to the
    /// incoming one, where it was asked (a stored version is missing) and allowed: the causes
    /// of its refusal, empty where it accepts. `None`: the findings word the refusal by the
    /// server's version.
    pub dry_run: Option<Vec<Cause>>,
    pub governed_by: Option<Governing>,
    /// How many objects it has, when counted.
    pub objects: Option<u64>,
    /// The objects' managedFields, when read.
    pub managed_fields: Option<crate::audit::Writes>,
    /// The objects checked against the incoming schema, when they were.
    pub validated: Option<Validated>,
    /// The StorageVersionMigrations of its resource (none where the API is not served).
    pub migrations: Vec<crate::migrate::builtin::Migration>,
    /// What could not be read, and why (the check of this CRD is incomplete: exit 2).
    pub unchecked: Vec<String>,
}

/// How the findings are judged.
#[derive(Clone, Debug)]
pub struct Judgement {
    pub now: Timestamp,
    /// A manager that wrote through a version within this long is an active writer.
    pub writers_window: Duration,
    /// The apiserver's `(major, minor)`, for its wording.
    pub server: Option<(u32, u32)>,
    /// Field managers the release replaces (`--replaced-manager`): their recent writes are
    /// `ReplacedWriters` (Info), not `ActiveWriters`.
    pub replaced_managers: Vec<String>,
}

/// The check of one incoming CRD against one cluster.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdCheck {
    pub name: String,
    /// Where the incoming CRD came from (`file.yaml`, document index).
    pub origin: String,
    /// Whether it exists live.
    pub live: bool,
    pub live_storage_version: Option<String>,
    pub incoming_storage_version: Option<String>,
    /// The live `status.storedVersions`.
    pub stored_versions: Vec<String>,
    /// The VersionPolicy governing it.
    pub governed_by: Option<String>,
    pub objects: Option<u64>,
    pub findings: Vec<Finding>,
    /// What could not be checked, and why.
    pub unchecked: Vec<String>,
}

impl CrdCheck {
    /// The worst severity among the findings, if any.
    pub fn worst(&self) -> Option<Severity> {
        self.findings.iter().map(|f| f.severity).min()
    }

    /// Whether the apply would be refused or would break something.
    pub fn blocking(&self) -> bool {
        self.worst().is_some_and(|s| s != Severity::Info)
    }
}

fn storage_of(versions: &[CustomResourceDefinitionVersion]) -> Option<&CustomResourceDefinitionVersion> {
    let mut storage = versions.iter().filter(|v| v.storage);
    match (storage.next(), storage.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    }
}

fn find<'a>(
    versions: &'a [CustomResourceDefinitionVersion],
    name: &str,
) -> Option<&'a CustomResourceDefinitionVersion> {
    versions.iter().find(|v| v.name == name)
}

/// The version's `openAPIV3Schema` as JSON.
pub fn schema_json(version: &CustomResourceDefinitionVersion) -> Option<Value> {
    let schema = version.schema.as_ref()?.open_api_v3_schema.as_ref()?;
    serde_json::to_value(schema).ok()
}

/// Whether a CRD's `spec.conversion` converts (a webhook) rather than only rewriting
/// `apiVersion` (`None`, the default).
pub fn converts(crd: &CustomResourceDefinition) -> bool {
    crd.spec
        .conversion
        .as_ref()
        .is_some_and(|c| c.strategy == "Webhook")
}

/// What objects stored in `from` lose when the apiserver reads them as `to` without a
/// conversion (it only rewrites `apiVersion`, then prunes what `to` does not have): the
/// fields of `from` that `to` lacks, and those whose type differs (they fail validation).
pub fn lost_without_conversion(from: &Value, to: &Value) -> Vec<String> {
    let old = schema::fields(&Schema::parse(from));
    let new = schema::fields(&Schema::parse(to));
    let mut lost = Vec::new();
    for (path, field) in &old {
        // Below a field the new schema keeps open, anything is kept.
        let kept_open = new
            .iter()
            .any(|(p, f)| f.open && path.len() > p.len() && path.starts_with(&format!("{p}.")));
        if kept_open {
            continue;
        }
        match new.get(path) {
            None => {
                // Report the topmost pruned field only.
                let parent_lost = lost.iter().any(|p: &String| path.starts_with(&format!("{p}.")));
                if !parent_lost {
                    lost.push(path.clone());
                }
            }
            Some(now) if now.signature != field.signature && !now.open => {
                lost.push(format!("{path} ({} → {})", field.signature, now.signature));
            }
            Some(_) => {}
        }
    }
    lost
}

/// `(v, time)` → `v (time)` for messages.
fn writers_text(writers: &[ManagerWrite]) -> String {
    writers
        .iter()
        .map(|w| match w.last_write {
            Some(at) => format!("{} (last write {at})", w.manager),
            None => w.manager.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn writers_of(summary: Option<&crate::audit::Writes>, version: &str) -> Vec<ManagerWrite> {
    let mut writers: Vec<ManagerWrite> = summary
        .and_then(|s| s.versions.get(version))
        .into_iter()
        .flat_map(|w| w.managers.iter())
        .map(|(manager, writes)| ManagerWrite {
            manager: manager.clone(),
            version: version.to_owned(),
            last_write: writes.last_write,
        })
        .collect();
    // Most recent first.
    writers.sort_by(|a, b| b.last_write.cmp(&a.last_write).then(a.manager.cmp(&b.manager)));
    writers
}

/// `12m 30s`-style, for an estimate.
pub fn human_duration(seconds: f64) -> String {
    let seconds = seconds.max(0.0).round() as u64;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m {:02}s", seconds / 60, seconds % 60),
        _ => format!("{}h {:02}m", seconds / 3600, (seconds % 3600) / 60),
    }
}

/// Every finding about applying `incoming` (read from `origin`) to a cluster where
/// `observed` was read.
pub fn check(
    incoming: &CustomResourceDefinition,
    origin: &str,
    observed: &Observed,
    judgement: &Judgement,
) -> CrdCheck {
    let name = incoming.metadata.name.clone().unwrap_or_default();
    let mut findings = Vec::new();
    let incoming_versions = &incoming.spec.versions;
    let incoming_storage = storage_of(incoming_versions);

    // The apiserver's rules on the CRD itself (the stored versions apart: below, with its
    // own words).
    let mut without_status = incoming.clone();
    without_status.status = None;
    for violation in apiserver_rules::violations(&without_status) {
        let kind = if violation.contains("storage version") {
            "StorageVersionCount"
        } else if violation.contains("deprecationWarning") {
            "InvalidDeprecationWarning"
        } else {
            "InvalidCrd"
        };
        findings.push(Finding::new(
            Severity::Rejected,
            kind,
            None,
            format!("the apiserver refuses it: {violation}"),
        ));
    }

    let Some(live) = &observed.live else {
        findings.push(Finding::new(
            Severity::Info,
            "NewCrd",
            incoming_storage.map(|v| v.name.as_str()),
            format!("{name} does not exist on this cluster: the apply creates it"),
        ));
        return CrdCheck {
            name,
            origin: origin.to_owned(),
            live: false,
            live_storage_version: None,
            incoming_storage_version: incoming_storage.map(|v| v.name.clone()),
            stored_versions: Vec::new(),
            governed_by: None,
            objects: None,
            findings,
            unchecked: observed.unchecked.clone(),
        };
    };
    let live_versions = &live.spec.versions;
    let live_storage = storage_of(live_versions);
    let stored: Vec<String> = live
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default();
    let summary = observed.managed_fields.as_ref();
    let governed = observed.governed_by.as_ref();

    // Rejected: a stored version the incoming CRD lacks, in the apiserver's words, and how
    // it is unblocked.
    let mut with_stored = incoming.clone();
    with_stored.status = live.status.clone();
    let missing = apiserver_rules::missing_stored_versions(&with_stored);
    let mut rewrite_needed = false;
    for (index, version) in &missing {
        // The apiserver's own words where a dry run asked it, else its version's.
        let field = format!("status.storedVersions[{index}]");
        let rejection = observed
            .dry_run
            .iter()
            .flatten()
            .find(|cause| cause.field == field)
            .map_or_else(
                || apiserver_rules::stored_version_rejection(*index, version, judgement.server),
                |cause| format!("{}: {}", cause.field, cause.message),
            );
        let live_storage_name = live_storage.map(|v| v.name.as_str());
        let (explanation, fix) = match (live_storage_name, incoming_storage) {
            (Some(storage), _) if find(incoming_versions, storage).is_some() && storage != version => (
                format!(
                    "objects may still be stored as {version}: `check --fix` rewrites every object into the storage version {storage} and trims status.storedVersions, then the apply succeeds"
                ),
                Some(FixStep::Migrate {
                    into: storage.to_owned(),
                }),
            ),
            (Some(storage), Some(target))
                if storage == version && find(live_versions, &target.name).is_some() =>
            {
                (
                    format!(
                        "objects are stored as {storage}, the live storage version, which this CRD lacks (an older release after the storage version moved forward?): `check --fix` moves the storage version back to {} (this CRD's storage version), rewrites every object into it through the live conversion and trims status.storedVersions, then the apply succeeds",
                        target.name
                    ),
                    Some(FixStep::Rollback {
                        from: storage.to_owned(),
                        to: target.name.clone(),
                    }),
                )
            }
            _ => (
                format!(
                    "objects may still be stored as {version}, and no version of the live CRD that this CRD keeps can take them: keep {version} in the incoming CRD"
                ),
                None,
            ),
        };
        rewrite_needed |= fix.is_some();
        let mut finding = Finding::new(
            Severity::Rejected,
            "StoredVersionMissing",
            Some(version),
            format!("{rejection} ({explanation})"),
        );
        finding.fix = fix;
        findings.push(finding);
    }

    // Breaking: a version disappears while a StorageVersionMigration could have trimmed
    // storedVersions before every object was rewritten (as it starts, or as it fails:
    // tests/fixtures/svm-failed-trims-stored-versions.txt). The stored-versions rule above
    // then passes though objects are still stored in the version.
    let removed: Vec<&str> = live_versions
        .iter()
        .filter(|v| find(incoming_versions, &v.name).is_none())
        .map(|v| v.name.as_str())
        .collect();
    if !removed.is_empty() {
        for migration in observed
            .migrations
            .iter()
            .filter(|m| m.holds_removals() && !crate::migrate::builtin::superseded(m, &observed.migrations))
        {
            let why = match &migration.state {
                crate::migrate::builtin::State::Failed(message) => format!(
                    "it failed ({message}), and Kubernetes trims status.storedVersions as a failed migration ends"
                ),
                _ => "it is unfinished, and Kubernetes can trim status.storedVersions as a migration starts"
                    .to_owned(),
            };
            findings.push(Finding::new(
                Severity::Breaking,
                "StorageVersionMigrationHoldsRemoval",
                Some(removed[0]),
                format!(
                    "{} disappears while StorageVersionMigration {} may have trimmed status.storedVersions before every object \
                     was rewritten: {why}; objects may still be stored in a version the CRD loses. List every version in \
                     status.storedVersions again (`kubectl patch crd {name} --subresource=status --type=merge -p \
                     '{{\"status\":{{\"storedVersions\":[{}]}}}}'`), rewrite every object (`crd-lifecycle migrate {name}` \
                     rewrites them and trims status.storedVersions), delete the migration, and check again",
                    removed.join(", "),
                    migration.name,
                    live_versions
                        .iter()
                        .map(|v| format!("\"{}\"", v.name))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            ));
        }
    }

    // Breaking: writers through versions that stop being served or disappear.
    let window =
        jiff::SignedDuration::try_from(judgement.writers_window).unwrap_or(jiff::SignedDuration::MAX);
    let active = |w: &ManagerWrite| {
        w.last_write
            .is_some_and(|at| judgement.now.duration_since(at) <= window)
    };
    for live_version in live_versions.iter().filter(|v| v.served) {
        let version = live_version.name.as_str();
        let after = find(incoming_versions, version);
        if after.is_some_and(|v| v.served) {
            continue;
        }
        let writers = writers_of(summary, version);
        let (recent, past): (Vec<ManagerWrite>, Vec<ManagerWrite>) = writers.into_iter().partition(active);
        let (replaced, recent): (Vec<ManagerWrite>, Vec<ManagerWrite>) = recent
            .into_iter()
            .partition(|w| judgement.replaced_managers.contains(&w.manager));
        let fate = if after.is_none() {
            "disappears"
        } else {
            "stops being served"
        };
        let within = human_duration(judgement.writers_window.as_secs_f64());
        if !recent.is_empty() {
            let mut finding = Finding::new(
                Severity::Breaking,
                "ActiveWriters",
                Some(version),
                format!(
                    "{version} {fate}, but field managers wrote through it within the last {within}: {}; their next write \
                     through it fails. Their writes are stored in the storage version, so `check --fix` migrates and trims \
                     all the same; name the ones this release replaces with --replaced-manager, and stop the others or point \
                     them at a version this CRD serves",
                    writers_text(&recent)
                ),
            );
            finding.managers = recent;
            findings.push(finding);
        }
        // A writer the release itself replaces (the old operator, until its upgrade or
        // rollback replaces it) stops writing through the version with the release.
        if !replaced.is_empty() {
            let repair = if after.is_none() {
                format!(
                    "; entries they write through it between `check --fix` and the apply name it again: \
                     `crd-lifecycle repair-managed-fields {name}` after the upgrade rewrites them"
                )
            } else {
                String::new()
            };
            let mut finding = Finding::new(
                Severity::Info,
                "ReplacedWriters",
                Some(version),
                format!(
                    "{version} {fate}; field managers this release replaces (--replaced-manager) wrote through it within the \
                     last {within}: {}{repair}",
                    writers_text(&replaced)
                ),
            );
            finding.managers = replaced;
            findings.push(finding);
        }
        let mut finding = Finding::new(
            Severity::Info,
            if after.is_none() {
                "VersionRemoved"
            } else {
                "VersionUnserved"
            },
            Some(version),
            if past.is_empty() {
                format!("{version} {fate}")
            } else {
                format!(
                    "{version} {fate}; earlier writers through it: {}",
                    writers_text(&past)
                )
            },
        );
        finding.managers = past;
        findings.push(finding);
    }

    // Breaking: managedFields entries naming a version that disappears (sample 29).
    let storage_after = live_storage
        .filter(|s| find(incoming_versions, &s.name).is_some())
        .or(incoming_storage)
        .map(|v| v.name.clone());
    let mut dropped_named = Vec::new();
    for (version, writers) in summary.map(|s| &s.versions).into_iter().flatten() {
        if find(live_versions, version).is_none() || find(incoming_versions, version).is_some() {
            continue;
        }
        dropped_named.push(version.clone());
        let managers = writers_of(summary, version);
        let mut finding = Finding::new(
            Severity::Breaking,
            "ManagedFieldsNameDroppedVersion",
            Some(version),
            format!(
                "{} objects have managedFields entries naming {version}, which this CRD drops: every server-side apply of them fails afterwards (\"request to convert CR to an invalid group/version\"), whatever the manager; managers: {}",
                writers.objects,
                writers_text(&managers)
            ),
        );
        finding.objects = Some(writers.objects);
        finding.managers = managers;
        if storage_after.is_some() {
            finding.fix = Some(FixStep::CleanManagedFields {
                versions: vec![version.clone()],
            });
        }
        findings.push(finding);
    }

    // Breaking: a storage switch without conversion between versions whose schemas differ.
    if let (Some(before), Some(after)) = (live_storage, incoming_storage)
        && before.name != after.name
    {
        if !converts(incoming)
            && let (Some(from), Some(to)) = (schema_json(before), schema_json(after))
        {
            let lost = lost_without_conversion(&from, &to);
            if !lost.is_empty() {
                let mut finding = Finding::new(
                    Severity::Breaking,
                    "StorageSwitchPrunesFields",
                    Some(&after.name),
                    format!(
                        "the storage version moves from {} to {} with conversion None: the apiserver only rewrites apiVersion, so objects stored as {} lose what {} lacks when read or written: {}",
                        before.name,
                        after.name,
                        before.name,
                        after.name,
                        lost.join(", ")
                    ),
                );
                finding.fields = lost;
                findings.push(finding);
            }
        }
        findings.push(Finding::new(
            Severity::Info,
            "StorageSwitch",
            Some(&after.name),
            format!(
                "the storage version moves from {} to {}: objects are written as {} from then on; the stored ones stay {} until rewritten",
                before.name, after.name, after.name, before.name
            ),
        ));
        rewrite_needed = true;
    }

    // Breaking: the storage version is not served (the apiserver accepts it, sample 06).
    if let Some(storage) = incoming_storage
        && !storage.served
    {
        findings.push(Finding::new(
            Severity::Breaking,
            "StorageVersionNotServed",
            Some(&storage.name),
            format!(
                "the storage version {} is not served: its objects cannot be read or rewritten through it, and a migration cannot run",
                storage.name
            ),
        ));
    }

    // Breaking: objects that fail the incoming schema.
    if let Some(validated) = &observed.validated
        && validated.invalid > 0
    {
        let shown: Vec<String> = validated
            .first
            .iter()
            .map(|p| format!("{} {}: {}", p.object, p.path, p.message))
            .collect();
        let mut finding = Finding::new(
            Severity::Breaking,
            "ObjectsInvalid",
            Some(&validated.version),
            format!(
                "{} of {} objects fail this CRD's {} schema: their next write is refused, and fields it prunes are lost; first: {}",
                validated.invalid,
                validated.checked,
                validated.version,
                shown.join("; ")
            ),
        );
        finding.objects = Some(validated.invalid);
        finding.invalid_objects = validated.first.clone();
        findings.push(finding);
    }

    // Info: what changes.
    for version in incoming_versions {
        match find(live_versions, &version.name) {
            None => findings.push(Finding::new(
                Severity::Info,
                "VersionAdded",
                Some(&version.name),
                format!(
                    "{} is added ({})",
                    version.name,
                    if version.served { "served" } else { "not served" }
                ),
            )),
            Some(before) => {
                if !before.served && version.served {
                    findings.push(Finding::new(
                        Severity::Info,
                        "VersionServed",
                        Some(&version.name),
                        format!("{} becomes served", version.name),
                    ));
                }
                let (was, is) = (
                    before.deprecated.unwrap_or(false),
                    version.deprecated.unwrap_or(false),
                );
                if was != is {
                    findings.push(Finding::new(
                        Severity::Info,
                        if is {
                            "VersionDeprecated"
                        } else {
                            "VersionUndeprecated"
                        },
                        Some(&version.name),
                        if is {
                            format!("{} becomes deprecated (clients get a warning)", version.name)
                        } else {
                            format!("{} is no longer deprecated", version.name)
                        },
                    ));
                }
            }
        }
    }
    if rewrite_needed {
        let objects = observed.objects;
        let rate = governed.and_then(|g| g.rate);
        let estimate = match (objects, rate) {
            (Some(objects), Some(rate)) if rate > 0.0 => format!(
                "about {} at the last measured migration rate ({rate:.0} objects/s, VersionPolicy {})",
                human_duration(objects as f64 / rate),
                governed.map(|g| g.name.as_str()).unwrap_or_default()
            ),
            _ => "time unknown (no migration of it was measured: no VersionPolicy governs it, or none has migrated it)".to_owned(),
        };
        let target = findings
            .iter()
            .find_map(|f| match &f.fix {
                Some(FixStep::Migrate { into }) => Some(into.clone()),
                Some(FixStep::Rollback { to, .. }) => Some(to.clone()),
                _ => None,
            })
            .or_else(|| incoming_storage.map(|v| v.name.clone()));
        let mut finding = Finding::new(
            Severity::Info,
            "ObjectsToRewrite",
            target.as_deref(),
            format!(
                "{} objects to rewrite into {}: {estimate}",
                objects.map_or_else(|| "?".to_owned(), |n| n.to_string()),
                target.as_deref().unwrap_or("the storage version")
            ),
        );
        finding.objects = objects;
        findings.push(finding);
    }
    findings.sort_by_key(|f| f.severity);
    CrdCheck {
        name,
        origin: origin.to_owned(),
        live: true,
        live_storage_version: live_storage.map(|v| v.name.clone()),
        incoming_storage_version: incoming_storage.map(|v| v.name.clone()),
        stored_versions: stored,
        governed_by: governed.map(|g| g.name.clone()),
        objects: observed.objects,
        findings,
        unchecked: observed.unchecked.clone(),
    }
}

/// After `check --fix`, keeps in the check again of a CRD the writers (`ActiveWriters`,
/// `ReplacedWriters`) its check before the fix found, for each version the new check names no
/// such writers for: the managedFields cleanup rewrote their entries, it did not stop them.
pub fn keep_writers(before: &CrdCheck, after: &mut CrdCheck) {
    for finding in &before.findings {
        if !matches!(finding.kind, "ActiveWriters" | "ReplacedWriters")
            || after
                .findings
                .iter()
                .any(|f| f.kind == finding.kind && f.version == finding.version)
        {
            continue;
        }
        let mut kept = finding.clone();
        kept.message
            .push_str(" (read before `check --fix` rewrote their managedFields entries)");
        after.findings.push(kept);
    }
    after.findings.sort_by_key(|f| f.severity);
}

/// What `check --fix` does for one CRD: the steps, in order, or why it refuses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FixPlan {
    pub steps: Vec<FixStep>,
    /// Why it refuses (nothing is done for this CRD when any).
    pub refusals: Vec<String>,
}

/// The fix for one checked CRD: exactly the steps that unblock it, or the reasons it cannot
/// be fixed safely.
pub fn plan_fix(check: &CrdCheck, observed: &Observed) -> FixPlan {
    let mut plan = FixPlan::default();
    if !check.blocking() {
        return plan;
    }
    for reason in &check.unchecked {
        plan.refusals
            .push(format!("it could not be checked completely: {reason}"));
    }
    let mut cleanup = Vec::new();
    for finding in check.findings.iter().filter(|f| f.severity != Severity::Info) {
        match (&finding.fix, finding.kind) {
            (Some(FixStep::CleanManagedFields { versions }), _) => cleanup.extend(versions.iter().cloned()),
            (Some(step), _) => {
                // A rollback moves the storage version back; the migration into it follows.
                let mut steps = vec![step.clone()];
                if let FixStep::Rollback { to, .. } = step {
                    steps.push(FixStep::Migrate { into: to.clone() });
                }
                for step in steps {
                    if !plan.steps.contains(&step) {
                        plan.steps.push(step);
                    }
                }
            }
            // Nothing to do on the cluster, and nothing in the way: a writer's writes are
            // stored in the storage version, so migrating and trimming are safe while it goes
            // on. The finding stays breaking.
            (None, "ActiveWriters") => {}
            (None, "StorageVersionMigrationHoldsRemoval") => plan.refusals.push(format!(
                "{}; `check --fix` does not trim what Kubernetes' migrator may have trimmed early",
                finding.message
            )),
            (None, "ObjectsInvalid") => plan.refusals.push(format!(
                "objects are invalid under the incoming schema ({}); fix them first: no rewrite makes them valid",
                finding.message
            )),
            (None, kind) => plan.refusals.push(format!("{kind} cannot be fixed on the cluster: {}", finding.message)),
        }
    }
    let rollback = plan.steps.iter().find_map(|s| match s {
        FixStep::Rollback { from, to } => Some((from.clone(), to.clone())),
        _ => None,
    });
    if let Some(governing) = &observed.governed_by {
        if rollback.is_some() && !governing.suspended {
            plan.refusals.push(format!(
                "VersionPolicy {0} governs {1}: the operator would move the storage version forward again. Suspend it first (`kubectl patch versionpolicy {0} --type merge -p '{{\"spec\":{{\"suspend\":true}}}}'`), or roll the policy back with the release",
                governing.name, check.name
            ));
        }
        if governing.migrating
            && plan
                .steps
                .iter()
                .any(|s| !matches!(s, FixStep::CleanManagedFields { .. }))
        {
            plan.refusals.push(format!(
                "VersionPolicy {} is migrating {} right now: wait for it to finish (never two migrators at once)",
                governing.name, check.name
            ));
        }
    }
    // Never two migrators at once: a StorageVersionMigration of the resource that is not
    // done (nor its end processed) rewrites objects and may trim storedVersions meanwhile.
    if let Some(unfinished) = observed
        .migrations
        .iter()
        .find(|m| !m.state.is_finished() || m.running)
        && plan
            .steps
            .iter()
            .any(|s| !matches!(s, FixStep::CleanManagedFields { .. }))
    {
        plan.refusals.push(format!(
            "StorageVersionMigration {} of {} is unfinished: wait for it to finish (never two migrators at once)",
            unfinished.name, check.name
        ));
    }
    // A stored version that must be rewritten into another without a conversion loses what
    // the target lacks: that drop needs a conversion the cluster does not have.
    if let Some(live) = &observed.live
        && !converts(live)
    {
        let target = plan.steps.iter().find_map(|s| match s {
            FixStep::Migrate { into } => Some(into.clone()),
            FixStep::Rollback { to, .. } => Some(to.clone()),
            FixStep::CleanManagedFields { .. } => None,
        });
        if let Some(target) = target
            && let Some(to) = find(&live.spec.versions, &target).and_then(schema_json)
        {
            for stale in check.stored_versions.iter().filter(|v| **v != target) {
                let Some(from) = find(&live.spec.versions, stale).and_then(schema_json) else {
                    continue;
                };
                let lost = lost_without_conversion(&from, &to);
                if !lost.is_empty() {
                    plan.refusals.push(format!(
                        "objects stored as {stale} must be rewritten into {target}, but {} has no conversion (strategy None), so they would lose {}: add a conversion webhook first",
                        check.name,
                        lost.join(", ")
                    ));
                }
            }
        }
    }
    if let Some((from, _)) = &rollback
        && plan
            .steps
            .iter()
            .any(|s| matches!(s, FixStep::Migrate { into } if into == from))
    {
        plan.refusals
            .push("the fix would both keep and leave the storage version".to_owned());
    }
    // Migrations first, the managedFields cleanup last (entries then name the final storage
    // version).
    plan.steps.sort_by_key(|s| match s {
        FixStep::Rollback { .. } => 0,
        FixStep::Migrate { .. } => 1,
        FixStep::CleanManagedFields { .. } => 2,
    });
    if !cleanup.is_empty() {
        cleanup.sort();
        cleanup.dedup();
        plan.steps.push(FixStep::CleanManagedFields { versions: cleanup });
    }
    if !plan.refusals.is_empty() {
        plan.steps.clear();
    }
    plan
}
