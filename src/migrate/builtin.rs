//! Kubernetes' built-in storage version migrator: `StorageVersionMigration` objects of
//! `storagemigration.k8s.io` (beta in 1.35-1.36, off by default; needs the
//! kube-controller-manager's `svm` controller). A migration names a group and resource (no
//! version); its conditions go `Running=True/MigrationRunning`, then
//! `Running=False/MigrationCompleted` with `Succeeded=True`, or `Failed=True`; as its end is
//! processed the CRD's `status.storedVersions` is trimmed to the storage version if the CRD's
//! generation did not move, on success (apiserver-samples/35) and on failure alike
//! (tests/fixtures/svm-failed-trims-stored-versions.txt).
//!
//! A migration this operator creates records, in annotations, the state of the CRD it was
//! created for (resourceVersion, generation, `storedVersions`, conversion fingerprint), so
//! that whoever follows it later (another leader) can tell whether it belongs to the CRD as
//! it is now, and what a trim after it may rely on.

use jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

use super::apiserver_clock;

/// The API group.
pub const GROUP: &str = "storagemigration.k8s.io";

/// Label on the migrations a policy creates: its name.
pub const POLICY_LABEL: &str = "crdlifecycle.io/policy";

/// Label on the migrations a policy creates: the storage version they migrate into.
pub const STORAGE_VERSION_LABEL: &str = "crdlifecycle.io/storage-version";

/// Annotation on the migrations a policy creates: the CRD's resourceVersion when it was
/// created (where a storage guard for it starts watching).
pub const CRD_RESOURCE_VERSION_ANNOTATION: &str = "crdlifecycle.io/crd-resource-version";

/// Annotation on the migrations a policy creates: the CRD's generation when it was created.
pub const CRD_GENERATION_ANNOTATION: &str = "crdlifecycle.io/crd-generation";

/// Annotation on the migrations a policy creates: the CRD's `status.storedVersions` when it
/// was created, comma-separated.
pub const STORED_VERSIONS_ANNOTATION: &str = "crdlifecycle.io/stored-versions";

/// Annotation on the migrations a policy creates: the fingerprint of the CRD's conversion
/// when it was created (`migrate::conversion_fingerprint`).
pub const CONVERSION_ANNOTATION: &str = "crdlifecycle.io/crd-conversion";

/// Annotation this operator puts on a failed migration of its own once the CRD's
/// `status.storedVersions` lists again every version the migration was created for:
/// Kubernetes ends a failed migration by trimming `storedVersions` to the storage version
/// when the CRD's generation did not move (`finishCRDMigration` in
/// pkg/controller/storageversionmigrator/migrationrunner.go does not look at the outcome),
/// though objects may still be stored in the versions it removed.
pub const RESTORED_ANNOTATION: &str = "crdlifecycle.io/stored-versions-restored";

/// Versions of the API this operator speaks, newest first (v1 has the v1beta1 shape).
const KNOWN_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// Where one migration is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Created, no condition yet.
    Pending,
    Running,
    Succeeded,
    /// `Failed=True`, with its message.
    Failed(String),
}

impl State {
    pub fn is_finished(&self) -> bool {
        matches!(self, State::Succeeded | State::Failed(_))
    }
}

/// Whether a migration of the resource created after `failed` ended succeeded, its end
/// processed: it rewrote every object, so what `failed`'s end trimmed is safe. (`created` is
/// the apiserver's clock, `changed` the kube-controller-manager's: both the control plane's.)
pub fn superseded(failed: &Migration, all: &[Migration]) -> bool {
    if !matches!(failed.state, State::Failed(_)) || failed.running {
        return false;
    }
    failed.changed.is_some_and(|ended| {
        all.iter().any(|m| {
            m.state == State::Succeeded && !m.running && m.created.is_some_and(|created| created > ended)
        })
    })
}

/// The CRD's record that the last StorageVersionMigration of its resource failed, if it
/// says so: Kubernetes' migrator sets its condition `StorageMigrating` to `False` with
/// reason `MigrationFailed` in the same write as its trim of `storedVersions`
/// (tests/fixtures/svm-failed-trims-stored-versions.txt; `finishCRDMigration` in
/// pkg/controller/storageversionmigrator/migrationrunner.go), and rewrites it only when a
/// later migration runs. The record (its `lastTransitionTime` and message)
/// outlives the migration, which may be deleted; it is only ever compared for equality
/// (`MigrationStatus::covers_failed_migration_on_crd`), never as a time.
pub fn failure_on_crd(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Option<String> {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| {
            c.type_ == "StorageMigrating"
                && c.status == "False"
                && c.reason.as_deref() == Some("MigrationFailed")
        })
        .map(|c| {
            format!(
                "{}: {}",
                c.last_transition_time
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            )
        })
}

/// At most this many failed migrations are recorded as covered by one run
/// (`processed_failures`), the latest to end first: only failures no later migration
/// superseded count, so more than this many of one resource means a migrator that has
/// failed for months without one success; the oldest beyond it keep holding removals.
pub const MAX_COVERED_FAILURES: usize = 200;

/// The UIDs of the failed migrations in `all` whose end Kubernetes has processed (and with
/// it trimmed `storedVersions`) and that still hold removals (not superseded by a later
/// success): read before a run lists its first object, they are what that run covers, if it
/// rewrites every object. A causal order, not a comparison of two clocks: no skew between
/// the controller and the kube-controller-manager can make a failure look older than a run.
pub fn processed_failures(all: &[Migration]) -> Vec<String> {
    let mut failed: Vec<&Migration> = all
        .iter()
        .filter(|m| matches!(m.state, State::Failed(_)) && !m.running && m.holds_removals())
        .filter(|m| !superseded(m, all))
        .collect();
    failed.sort_by_key(|m| std::cmp::Reverse(m.changed));
    failed
        .into_iter()
        .filter_map(|m| m.uid.clone())
        .take(MAX_COVERED_FAILURES)
        .collect()
}

impl Migration {
    /// Whether removing a version of the resource must wait for this migration. Kubernetes
    /// can trim `status.storedVersions` before every object is rewritten: as a migration
    /// starts, and as a failed one ends. So: while it is pending or running; while its end
    /// is still to be processed (`Running=True` next to `Succeeded` or `Failed`: the trim is
    /// yet to come); and once failed, until `storedVersions` lists again what it listed
    /// when the migration was created (`RESTORED_ANNOTATION`).
    pub fn holds_removals(&self) -> bool {
        match self.state {
            State::Pending | State::Running => true,
            State::Succeeded => self.running,
            State::Failed(_) => self.running || !self.restored,
        }
    }
}

/// One StorageVersionMigration.
#[derive(Clone, Debug, PartialEq)]
pub struct Migration {
    pub name: String,
    /// Its `metadata.uid`: a migration deleted and created again under the same name is
    /// another migration.
    pub uid: Option<String>,
    pub group: String,
    pub resource: String,
    pub state: State,
    /// The policy that created it (its label), if one did.
    pub policy: Option<String>,
    /// The storage version it migrates into (its label), if a policy created it.
    pub storage_version: Option<String>,
    pub created: Option<Timestamp>,
    /// When its last condition changed.
    pub changed: Option<Timestamp>,
    /// The state of the CRD it was created for (its annotations), if a policy created it
    /// with them.
    pub created_for: Option<CreatedFor>,
    /// `Running=True`: Kubernetes has not yet processed its end (nor, for a CRD, trimmed
    /// `storedVersions` after it), whatever its other conditions say.
    pub running: bool,
    /// Carries `RESTORED_ANNOTATION`.
    pub restored: bool,
    /// Its `metadata.resourceVersion` as read: a delete on this precondition fails (409)
    /// once Kubernetes has started it (its status written since).
    pub resource_version: Option<String>,
}

/// The state of the CRD a migration was created for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedFor {
    pub resource_version: String,
    pub generation: Option<i64>,
    pub stored_versions: Vec<String>,
    pub conversion: String,
}

impl CreatedFor {
    fn annotations(&self) -> Value {
        json!({
            CRD_RESOURCE_VERSION_ANNOTATION: self.resource_version,
            CRD_GENERATION_ANNOTATION: self.generation.map(|g| g.to_string()).unwrap_or_default(),
            STORED_VERSIONS_ANNOTATION: self.stored_versions.join(","),
            CONVERSION_ANNOTATION: self.conversion,
        })
    }

    fn from_annotations(object: &Value) -> Option<CreatedFor> {
        let annotation = |key: &str| {
            object
                .pointer(&format!("/metadata/annotations/{}", key.replace('/', "~1")))
                .and_then(Value::as_str)
        };
        Some(CreatedFor {
            resource_version: annotation(CRD_RESOURCE_VERSION_ANNOTATION)?.to_owned(),
            generation: annotation(CRD_GENERATION_ANNOTATION).and_then(|g| g.parse().ok()),
            stored_versions: annotation(STORED_VERSIONS_ANNOTATION)?
                .split(',')
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
                .collect(),
            conversion: annotation(CONVERSION_ANNOTATION).unwrap_or_default().to_owned(),
        })
    }
}

/// Migrations as listed, and the apiserver's clock when they were.
#[derive(Clone, Debug)]
pub struct Listed {
    /// Oldest first.
    pub migrations: Vec<Migration>,
    /// The list answer's `date`.
    pub at: Option<Timestamp>,
}

impl Migration {
    /// Reads a StorageVersionMigration (JSON).
    pub fn from_json(object: &Value) -> Migration {
        let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str).map(str::to_owned);
        let conditions: Vec<&Value> = object
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .map(|c| c.iter().collect())
            .unwrap_or_default();
        let is_true = |kind: &str| {
            conditions
                .iter()
                .find(|c| c["type"] == kind)
                .filter(|c| c["status"] == "True")
        };
        let state = if let Some(failed) = is_true("Failed") {
            State::Failed(failed["message"].as_str().unwrap_or_default().to_owned())
        } else if is_true("Succeeded").is_some() {
            State::Succeeded
        } else if is_true("Running").is_some() {
            State::Running
        } else {
            State::Pending
        };
        let changed = conditions
            .iter()
            .filter_map(|c| c["lastTransitionTime"].as_str()?.parse::<Timestamp>().ok())
            .max();
        Migration {
            name: text("/metadata/name").unwrap_or_default(),
            uid: text("/metadata/uid"),
            group: text("/spec/resource/group").unwrap_or_default(),
            resource: text("/spec/resource/resource").unwrap_or_default(),
            state,
            policy: text(&format!("/metadata/labels/{}", POLICY_LABEL.replace('/', "~1"))),
            storage_version: text(&format!(
                "/metadata/labels/{}",
                STORAGE_VERSION_LABEL.replace('/', "~1")
            )),
            created: text("/metadata/creationTimestamp").and_then(|t| t.parse().ok()),
            changed,
            created_for: CreatedFor::from_annotations(object),
            running: is_true("Running").is_some(),
            resource_version: text("/metadata/resourceVersion"),
            restored: object
                .pointer(&format!(
                    "/metadata/annotations/{}",
                    RESTORED_ANNOTATION.replace('/', "~1")
                ))
                .is_some(),
        }
    }
}

/// The API, at one served version.
#[derive(Clone)]
pub struct Migrations {
    client: Client,
    api: Api<DynamicObject>,
    /// e.g. `v1beta1`.
    pub version: String,
}

impl Migrations {
    /// The newest served version of the API that this operator speaks, or `None` when the
    /// apiserver does not serve it.
    pub async fn discover(client: &Client) -> Result<Option<Migrations>, kube::Error> {
        let request = http::Request::get(format!("/apis/{GROUP}"))
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        let group: Value = match client.request(request).await {
            Ok(group) => group,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
            Err(error) => return Err(error),
        };
        let served: Vec<&str> = group["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["version"].as_str())
            .collect();
        let Some(version) = KNOWN_VERSIONS.into_iter().find(|v| served.contains(v)) else {
            return Ok(None);
        };
        let resource = ApiResource {
            group: GROUP.to_owned(),
            version: version.to_owned(),
            api_version: format!("{GROUP}/{version}"),
            kind: "StorageVersionMigration".to_owned(),
            plural: "storageversionmigrations".to_owned(),
        };
        Ok(Some(Migrations {
            client: client.clone(),
            api: Api::all_with(client.clone(), &resource),
            version: version.to_owned(),
        }))
    }

    fn path(&self) -> String {
        format!("/apis/{GROUP}/{}/storageversionmigrations", self.version)
    }

    /// Every migration of `group`/`resource`, oldest first, and the apiserver's clock.
    pub async fn of_resource(&self, group: &str, resource: &str) -> Result<Listed, kube::Error> {
        let listed = apiserver_clock::get::<Value>(&self.client, &self.path())
            .await?
            .ok_or_else(|| not_found(&self.path()))?;
        let mut found: Vec<Migration> = listed.value["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(Migration::from_json)
            .filter(|m| m.group == group && m.resource == resource)
            .collect();
        found.sort_by_key(|m| (m.created, m.name.clone()));
        Ok(Listed {
            migrations: found,
            at: listed.date,
        })
    }

    /// Creates a migration of `group`/`resource`, labelled with the policy and storage
    /// version, annotated with the state of the CRD it is created for.
    pub async fn create(
        &self,
        name: &str,
        group: &str,
        resource: &str,
        policy: &str,
        storage_version: &str,
        created_for: &CreatedFor,
    ) -> Result<Migration, kube::Error> {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/{}", self.version),
            "kind": "StorageVersionMigration",
            "metadata": {"name": name, "labels": {POLICY_LABEL: policy, STORAGE_VERSION_LABEL: storage_version},
                         "annotations": created_for.annotations()},
            "spec": {"resource": {"group": group, "resource": resource}},
        }))
        .map_err(kube::Error::SerdeError)?;
        let created = self.api.create(&PostParams::default(), &object).await?;
        Ok(Migration::from_json(
            &serde_json::to_value(created).map_err(kube::Error::SerdeError)?,
        ))
    }

    /// Marks a failed migration whose `storedVersions` were restored (`RESTORED_ANNOTATION`).
    pub async fn mark_restored(&self, name: &str) -> Result<(), kube::Error> {
        let patch = json!({"metadata": {"annotations": {RESTORED_ANNOTATION: "true"}}});
        self.api
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
    }

    /// Deletes `migration` only if it is as read: `Ok(false)` when it changed since (409
    /// Conflict on the resourceVersion precondition, e.g. Kubernetes started it meanwhile:
    /// tests/fixtures/apiserver/svm-delete-precondition-v1.36.txt), `Ok(true)` when deleted
    /// or gone. A deleted migration the kube-controller-manager had not started never runs;
    /// a Running one deleted goes on rewriting unseen
    /// (tests/fixtures/apiserver/svm-delete-v1.36.txt), so one that may have started is kept.
    pub async fn delete_as_read(&self, migration: &Migration) -> Result<bool, kube::Error> {
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: migration.resource_version.clone(),
                uid: migration.uid.clone(),
            }),
            ..kube::api::DeleteParams::default()
        };
        match self.api.delete(&migration.name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// One migration, and the apiserver's clock when it was read.
    pub async fn get(&self, name: &str) -> Result<(Migration, Option<Timestamp>), kube::Error> {
        let path = format!("{}/{name}", self.path());
        match apiserver_clock::get::<Value>(&self.client, &path).await? {
            Some(read) => Ok((Migration::from_json(&read.value), read.date)),
            None => Err(not_found(&path)),
        }
    }
}

fn not_found(path: &str) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(&format!("{path} not found"), "NotFound")
            .with_code(404)
            .boxed(),
    )
}

/// The name of a policy's `attempt`th migration into `storage_version`: deterministic, so
/// that a restarted controller finds it, and a DNS subdomain of at most 253 characters.
pub fn migration_name(crd: &str, storage_version: &str, attempt: u32) -> String {
    let suffix = format!("-{storage_version}-{attempt}");
    let head: String = format!("crd-lifecycle.{crd}")
        .chars()
        .take(253 - suffix.len())
        .collect();
    format!("{}{suffix}", head.trim_end_matches(['.', '-']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_lifecycle_reads_as_running_then_succeeded() {
        // apiserver-samples/35: the conditions seen while polling.
        let with = |conditions: Value| {
            Migration::from_json(
                &json!({"metadata": {"name": "m"}, "spec": {"resource": {"group": "g", "resource": "r"}},
                                          "status": {"conditions": conditions}}),
            )
            .state
        };
        assert_eq!(with(json!([])), State::Pending);
        assert_eq!(
            with(json!([{"type": "Running", "status": "True", "reason": "MigrationRunning"}])),
            State::Running
        );
        assert_eq!(
            with(
                json!([{"type": "Running", "status": "False", "reason": "MigrationCompleted"},
                        {"type": "Succeeded", "status": "True", "reason": "StorageVersionMigrationSucceeded"}])
            ),
            State::Succeeded
        );
        assert_eq!(
            with(
                json!([{"type": "Running", "status": "False"}, {"type": "Failed", "status": "True", "message": "boom"}])
            ),
            State::Failed("boom".into())
        );
    }

    /// A run covers the failures processed before it lists: ended (not `Running`), not
    /// superseded by a later success, not restored; the latest first, by UID.
    #[test]
    fn a_run_covers_the_processed_failures_no_success_superseded() {
        let at = |name: &str, created: &str, conditions: Value| {
            Migration::from_json(&json!({
                "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": created},
                "spec": {"resource": {"group": "g", "resource": "r"}},
                "status": {"conditions": conditions}}))
        };
        let failed = |ended: &str, running: &str| {
            json!([{"type": "Running", "status": running, "lastTransitionTime": ended},
                   {"type": "Failed", "status": "True", "lastTransitionTime": ended}])
        };
        let succeeded = json!([{"type": "Running", "status": "False", "lastTransitionTime": "2026-01-01T05:00:00Z"},
                               {"type": "Succeeded", "status": "True", "lastTransitionTime": "2026-01-01T05:00:00Z"}]);
        let all = [
            at(
                "old",
                "2026-01-01T00:00:00Z",
                failed("2026-01-01T01:00:00Z", "False"),
            ),
            at("success", "2026-01-01T02:00:00Z", succeeded),
            at(
                "later",
                "2026-01-01T03:00:00Z",
                failed("2026-01-01T04:00:00Z", "False"),
            ),
            at(
                "latest",
                "2026-01-01T06:00:00Z",
                failed("2026-01-01T07:00:00Z", "False"),
            ),
            at(
                "ending",
                "2026-01-01T08:00:00Z",
                failed("2026-01-01T09:00:00Z", "True"),
            ),
        ];
        // "old" is superseded by "success" (created after it ended); "ending" is not
        // processed yet (its trim is still to come).
        assert_eq!(processed_failures(&all), ["uid-latest", "uid-later"]);
    }

    #[test]
    fn the_state_it_was_created_for_reads_back() {
        let created_for = CreatedFor {
            resource_version: "10042".into(),
            generation: Some(7),
            stored_versions: vec!["v1".into(), "v2".into()],
            conversion: "0a1b".into(),
        };
        let object = json!({"metadata": {"name": "m", "annotations": created_for.annotations()}});
        assert_eq!(Migration::from_json(&object).created_for, Some(created_for));
        // Created before the annotations existed: nothing to tell.
        assert_eq!(
            Migration::from_json(&json!({"metadata": {"name": "m"}})).created_for,
            None
        );
    }

    #[test]
    fn names_are_deterministic_dns_subdomains() {
        assert_eq!(
            migration_name("widgets.example.com", "v1", 1),
            "crd-lifecycle.widgets.example.com-v1-1"
        );
        let long = format!("{}.example.com", "a".repeat(260));
        let name = migration_name(&long, "v1", 12);
        assert!(name.len() <= 253 && name.ends_with("-v1-12"), "{name}");
    }
}
