//! Kubernetes' built-in StorageVersionMigration (`storagemigration.k8s.io/v1beta1`) and the
//! kube-controller-manager's `svm` controller behind it, as apiserver-samples/35 recorded
//! them on v1.36:
//! - `POST .../storageversionmigrations` answers 201 with the object and `status: {}`;
//! - its conditions go `Running=True/MigrationRunning`, then `Running=False/MigrationCompleted`
//!   with `Succeeded=True/StorageVersionMigrationSucceeded`;
//! - on success every object of the resource is stored in the storage version and the CRD's
//!   `status.storedVersions` is trimmed to it.
//!
//! The controller's progress is modelled as one step per GET of the migration (the sample
//! polled and saw each stage in turn). A failure (the `svm_fail` knob) is as
//! tests/fixtures/svm-failed-trims-stored-versions.txt recorded it on v1.36.2: `Failed=True`
//! is added next to `Running=True` (`setStatusConditions` appends), then, as the end is
//! processed, the CRD's `storedVersions` is trimmed to the storage version though no object
//! was rewritten, and `Running` turns False/MigrationCompleted.
//! - `PATCH` (merge) of a migration's annotations answers 200 with the object (same fixture).
//! - `DELETE` answers 200 with a `Status` `Success` naming it (not the object), and it is gone
//!   at once (tests/fixtures/apiserver/svm-delete-v1.36.txt). A Pending one never runs. (A
//!   Running one, recorded too, stops changing the CRD: no trim, its `StorageMigrating`
//!   condition stays True; the real migrator may go on rewriting objects into the storage
//!   version, which the fake does not model: a rewrite into the storage version is safe.)
//!
//! Where the API is not served (v1.24, or 1.35+ without the feature), `GET
//! /apis/storagemigration.k8s.io` answers the plain-text 404 of a path nobody serves (as
//! sample 15 for an unserved version).

use serde_json::{Value, json};

use super::{State, not_found, status_body};

pub(super) const GROUP: &str = "storagemigration.k8s.io";

/// `GET /apis/storagemigration.k8s.io`: the APIGroup (v1beta1 only, as in 1.35-1.36).
pub(super) fn api_group(state: &State) -> Option<Value> {
    state.svm_served.then(|| {
        let version = json!({"groupVersion": format!("{GROUP}/v1beta1"), "version": "v1beta1"});
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP,
               "versions": [version], "preferredVersion": version})
    })
}

pub(super) fn create(state: &mut State, mut body: Value) -> (u16, Value) {
    let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    if state.svms.contains_key(&name) {
        return (
            409,
            status_body(
                409,
                "AlreadyExists",
                &format!("storageversionmigrations.storagemigration.k8s.io \"{name}\" already exists"),
            ),
        );
    }
    body["metadata"]["resourceVersion"] = state.next_resource_version().into();
    body["metadata"]["uid"] = json!(format!("svm-{name}"));
    body["metadata"]["creationTimestamp"] = json!(state.now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    body["status"] = json!({});
    state.svms.insert(name, body.clone());
    (201, body)
}

pub(super) fn list(state: &State) -> (u16, Value) {
    (
        200,
        json!({"kind": "StorageVersionMigrationList", "apiVersion": format!("{GROUP}/v1beta1"),
               "metadata": {"resourceVersion": state.resource_version.to_string()},
               "items": state.svms.values().cloned().collect::<Vec<_>>()}),
    )
}

/// One GET: the svm controller takes its next step, then the object as it is.
pub(super) fn get(state: &mut State, name: &str) -> (u16, Value) {
    let Some(object) = state.svms.get(name).cloned() else {
        return not_found("storageversionmigrations.storagemigration.k8s.io", name);
    };
    let advanced = advance(state, object);
    state.svms.insert(name.to_owned(), advanced.clone());
    (200, advanced)
}

fn condition(at: jiff::Timestamp, kind: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": kind, "status": status, "lastTransitionTime": at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
           "reason": reason, "message": message})
}

fn advance(state: &mut State, mut object: Value) -> Value {
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let ours = object["metadata"]["labels"]["crdlifecycle.io/policy"].is_string();
    let conditions = object["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let running = conditions
        .iter()
        .any(|c| c["type"] == "Running" && c["status"] == "True");
    let failed = conditions
        .iter()
        .any(|c| c["type"] == "Failed" && c["status"] == "True");
    let finished = failed
        || conditions
            .iter()
            .any(|c| c["type"] == "Succeeded" && c["status"] == "True");
    if state.svm_paused || (finished && !(failed && running)) {
        return object;
    }
    let now = state.now();
    if !running {
        object["status"]["conditions"] = json!([condition(now, "Running", "True", "MigrationRunning", "")]);
        // The generation it runs for: its end trims storedVersions only if it did not move.
        // The CRD says it runs ("Migration NAME is running", recorded in
        // tests/fixtures/svm-failed-trims-stored-versions.txt).
        let crd_name = crd_of(&object);
        let generation = state
            .crds
            .get(&crd_name)
            .map(|crd| crd["metadata"]["generation"].clone());
        state
            .svm_generations
            .insert(name.clone(), generation.unwrap_or_default());
        if let Some(mut crd) = state.crds.get(&crd_name).cloned() {
            set_storage_migrating(
                state,
                &mut crd,
                "True",
                "MigrationRunning",
                &format!("Migration {name} is running"),
            );
            state.store_crd(crd, false);
        }
        return object;
    }
    let group = object["spec"]["resource"]["group"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let resource = object["spec"]["resource"]["resource"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let crd_name = format!("{resource}.{group}");
    // The end of a failed migration processed: storedVersions trimmed, nothing rewritten.
    if failed {
        trim_stored_versions(state, &crd_name, &name, false);
        state.step(&format!("kubernetes: failed StorageVersionMigration {name}"));
        let mut conditions = conditions;
        conditions.retain(|c| c["type"] != "Running");
        conditions.insert(
            0,
            condition(
                now,
                "Running",
                "False",
                "MigrationCompleted",
                "Migration completed",
            ),
        );
        object["status"]["conditions"] = json!(conditions);
        return object;
    }
    if let Some(message) = state
        .svm_fail
        .clone()
        .or_else(|| state.svm_fail_by_name.get(&name).cloned())
    {
        object["status"]["conditions"] = json!([
            condition(
                now,
                "Running",
                "True",
                "MigrationRunning",
                "The migration is running"
            ),
            condition(
                now,
                "Failed",
                "True",
                "StorageVersionMigrationFailed",
                &format!("migration encountered unhandled error: {message}")
            ),
        ]);
        return object;
    }
    if state.storage_version(&crd_name).is_some() {
        // Each object is written through an apiserver, which encodes it in the storage
        // version as it sees it (`switch_lag`: one that has not acted on a switch yet).
        let keys: Vec<_> = state
            .objects
            .keys()
            .filter(|(crd, _, _)| *crd == crd_name)
            .cloned()
            .collect();
        for key in keys {
            let storage = state.effective_crd(&crd_name).as_ref().and_then(storage_of);
            if let (Some(storage), Some(stored)) = (storage, state.objects.get_mut(&key)) {
                stored.encoded_as = storage;
            }
        }
        trim_stored_versions(state, &crd_name, &name, true);
        let whose = if ours { "the controller's" } else { "another's" };
        state.step(&format!(
            "kubernetes: {whose} StorageVersionMigration {name} succeeded"
        ));
    }
    object["status"]["conditions"] = json!([
        condition(
            now,
            "Running",
            "False",
            "MigrationCompleted",
            "Migration completed"
        ),
        condition(now, "Succeeded", "True", "StorageVersionMigrationSucceeded", ""),
    ]);
    object["status"]["resourceVersion"] = json!(state.next_resource_version());
    object
}

/// The CRD a migration is for (`<resource>.<group>`).
fn crd_of(object: &Value) -> String {
    format!(
        "{}.{}",
        object["spec"]["resource"]["resource"]
            .as_str()
            .unwrap_or_default(),
        object["spec"]["resource"]["group"].as_str().unwrap_or_default()
    )
}

/// The version a CRD marks `storage: true`.
fn storage_of(crd: &Value) -> Option<String> {
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["storage"] == true)
        .and_then(|v| v["name"].as_str())
        .map(str::to_owned)
}

/// `finishCRDMigration`: a status write of the CRD, as any, trimming `storedVersions` to
/// the storage version, whether the migration succeeded or failed, when the CRD's
/// generation did not move since the migration started running (the fixture's note), and
/// setting its condition `StorageMigrating` to `False` in the same write: reason
/// `MigrationFailed` ("The migration has failed", recorded in
/// tests/fixtures/svm-failed-trims-stored-versions.txt) or `MigrationSucceeded`
/// (`finishCRDMigration` in pkg/controller/storageversionmigrator/migrationrunner.go, seen on
/// v1.36.2 by the e2e scenario `builtin_migration`).
fn trim_stored_versions(state: &mut State, crd_name: &str, migration: &str, succeeded: bool) {
    let Some(mut crd) = state.crds.get(crd_name).cloned() else {
        return;
    };
    // Only at the generation its start recorded (`observedGeneration` of the condition it
    // set; none recorded: none set). `svm_leaves_stored_versions`: as if it had moved.
    let trims = !state.svm_leaves_stored_versions
        && state
            .svm_generations
            .get(migration)
            .is_some_and(|started| *started == crd["metadata"]["generation"]);
    let (reason, message) = match (succeeded, trims) {
        (true, true) => (
            "MigrationSucceeded",
            "The migration has succeeded and the stored versions have been updated",
        ),
        (true, false) => (
            "MigrationSucceeded",
            "The migration has succeeded but the stored versions have not been updated due to a generation mismatch",
        ),
        (false, _) => ("MigrationFailed", "The migration has failed"),
    };
    set_storage_migrating(state, &mut crd, "False", reason, message);
    if trims && let Some(storage) = state.storage_version(crd_name) {
        crd["status"]["storedVersions"] = json!([storage]);
    }
    state.store_crd(crd, false);
}

/// The CRD's condition `StorageMigrating` as Kubernetes' migrator sets it (a server-side
/// apply of the status, `observedGeneration` the CRD's generation).
fn set_storage_migrating(state: &mut State, crd: &mut Value, status: &str, reason: &str, message: &str) {
    let mut condition = condition(state.now(), "StorageMigrating", status, reason, message);
    condition["observedGeneration"] = crd["metadata"]["generation"].clone();
    let conditions = crd["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut conditions: Vec<Value> = conditions
        .into_iter()
        .filter(|c| c["type"] != "StorageMigrating")
        .collect();
    conditions.push(condition);
    crd["status"]["conditions"] = json!(conditions);
}

impl State {
    /// Someone creates a StorageVersionMigration (`POST`, as `create` answers it).
    pub fn create_svm(&mut self, body: Value) -> (u16, Value) {
        create(self, body)
    }

    /// The svm controller acts on migration `name` alone, now (one step of `advance`).
    /// The version the CRD marks `storage: true`, as stored.
    pub fn storage_version(&self, crd_name: &str) -> Option<String> {
        self.crds.get(crd_name).and_then(storage_of)
    }

    pub fn svm_advance(&mut self, name: &str) {
        if let Some(object) = self.svms.get(name).cloned() {
            let advanced = self.advanced(object);
            self.svms.insert(name.to_owned(), advanced);
        }
    }

    /// A migration's next step; a change is a write, at a new resourceVersion (a status
    /// update: tests/fixtures/apiserver/svm-delete-precondition-v1.36.txt, 293 -> 294).
    fn advanced(&mut self, object: Value) -> Value {
        let mut advanced = advance(self, object.clone());
        if advanced != object {
            advanced["metadata"]["resourceVersion"] = self.next_resource_version().into();
        }
        advanced
    }

    /// The kube-controller-manager's svm controller takes its next step on every
    /// migration (as it does on its own, whether or not anyone reads them).
    pub fn svm_controller_tick(&mut self) {
        let names: Vec<String> = self.svms.keys().cloned().collect();
        for name in names {
            if let Some(object) = self.svms.get(&name).cloned() {
                let advanced = self.advanced(object);
                self.svms.insert(name, advanced);
            }
        }
    }
}

/// `PATCH` (merge) of a migration: its annotations.
pub(super) fn patch(state: &mut State, name: &str, body: &Value) -> (u16, Value) {
    let Some(object) = state.svms.get_mut(name) else {
        return not_found("storageversionmigrations.storagemigration.k8s.io", name);
    };
    if let Some(annotations) = body["metadata"]["annotations"].as_object() {
        for (key, value) in annotations {
            object["metadata"]["annotations"][key] = value.clone();
        }
    }
    let object = object.clone();
    (200, object)
}

/// `DELETE .../storageversionmigrations/NAME` (tests/fixtures/apiserver/svm-delete-v1.36.txt):
/// 200 with a `Status` `Success` and the migration's name, group, plural kind and UID; 404
/// NotFound when there is none (also with a precondition). A `preconditions.resourceVersion`
/// that is not the migration's answers 409 Conflict and deletes nothing
/// (tests/fixtures/apiserver/svm-delete-precondition-v1.36.txt).
pub(super) fn delete(state: &mut State, name: &str, body: &Value) -> (u16, Value) {
    let Some(current) = state.svms.get(name) else {
        return not_found("storageversionmigrations.storagemigration.k8s.io", name);
    };
    let conflict = |message: String| {
        (
            409,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": format!("Operation cannot be fulfilled on StorageVersionMigration.storagemigration.k8s.io \"{name}\": {message}"),
                   "reason": "Conflict",
                   "details": {"name": name, "group": GROUP, "kind": "StorageVersionMigration"},
                   "code": 409}),
        )
    };
    if let Some(expected) = body["preconditions"]["uid"].as_str() {
        let actual = current["metadata"]["uid"].as_str().unwrap_or_default();
        if expected != actual {
            return conflict(format!(
                "the UID in the precondition ({expected}) does not match the UID in record ({actual}). The object \
                 might have been deleted and then recreated"
            ));
        }
    }
    if let Some(expected) = body["preconditions"]["resourceVersion"].as_str() {
        let actual = current["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default();
        if expected != actual {
            return conflict(format!(
                "the ResourceVersion in the precondition ({expected}) does not match the ResourceVersion in record \
                 ({actual}). The object might have been modified"
            ));
        }
    }
    let Some(removed) = state.svms.remove(name) else {
        return not_found("storageversionmigrations.storagemigration.k8s.io", name);
    };
    (
        200,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
               "details": {"name": name, "group": GROUP, "kind": "storageversionmigrations",
                           "uid": removed["metadata"]["uid"]}}),
    )
}
