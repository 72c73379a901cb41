//! Whether a migration holds the removal of a version (Kubernetes may have trimmed
//! `storedVersions` before every object was rewritten), and which failed migrations a run
//! of ours covers.

use super::object::{Migration, State};

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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

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
}
