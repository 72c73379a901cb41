//! One StorageVersionMigration as read: where it is (`State`), what labels and annotations
//! say of it, and the state of the CRD it was created for (`CreatedFor`).

use jiff::Timestamp;
use serde_json::{Value, json};

use super::{
    CONVERSION_ANNOTATION, CRD_GENERATION_ANNOTATION, CRD_RESOURCE_VERSION_ANNOTATION, POLICY_LABEL,
    RESTORED_ANNOTATION, STORAGE_VERSION_LABEL, STORED_VERSIONS_ANNOTATION,
};

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
    pub(super) fn annotations(&self) -> Value {
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
}
