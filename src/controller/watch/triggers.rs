//! What starts a reconcile. A reconcile acts on the policy's spec, its deletion, its approval
//! annotation, the results its background jobs record in its status, and its CRD; it writes
//! the policy's status and finalizer, Events and the CRD. Only a change of what it acts on
//! starts one: its own writes coming back through the watches do not (each echo is a whole
//! reconcile, and 1,000 policies due at the same instant then wait behind each other's
//! echoes).

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use kube::Resource;
use kube::core::DeserializeGuard;

use crate::api::{MigrationStatus, VersionPolicy};
use crate::lifecycle::APPROVE_ANNOTATION;
use crate::sync::lock;

/// Fields of a job's status that a running job rewrites as it goes (every 2 s): counts and
/// its checkpoint. What the reconcile acts on (phase, storage version, versions, times,
/// message) is the rest.
const PROGRESS_FIELDS: [&str; 8] = [
    "listed",
    "rewritten",
    "skipped",
    "failed",
    "total",
    "progress",
    "checkpoint",
    "failures",
];

/// The predicate of the policy watch (`kube::runtime::predicates`): a hash of what a
/// reconcile acts on. Unchanged for the reconcile's own status writes (field manager
/// `crd-lifecycle`), its finalizer, and a running job's progress; changed by a spec change
/// (generation), a deletion (the apiserver adds 1 to the generation as well), the approval
/// annotation, a migration or cleanup that starts, ends or changes phase, and a preflight
/// that starts, ends or checks its objects again.
pub fn policy_inputs(policy: &DeserializeGuard<VersionPolicy>) -> Option<u64> {
    let meta = policy.meta();
    let mut hasher = DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(APPROVE_ANNOTATION))
        .hash(&mut hasher);
    // The same hash whether the status is absent or has none of these.
    let status = policy.0.as_ref().ok().and_then(|p| p.status.as_ref());
    job_outcome(status.and_then(|s| s.migration.as_ref())).hash(&mut hasher);
    job_outcome(status.and_then(|s| s.managed_fields_cleanup.as_ref())).hash(&mut hasher);
    match status.and_then(|s| s.preflight.as_ref()) {
        Some(preflight) => serde_json::to_string(preflight).unwrap_or_default(),
        None => String::new(),
    }
    .hash(&mut hasher);
    // Each store's preflight: its phase, its result and when its objects were last checked
    // (a store waits for a check that recent), not its count of objects read so far.
    for preflight in status.map(|s| s.preflights.as_slice()).unwrap_or_default() {
        preflight_outcome(preflight).hash(&mut hasher);
    }
    Some(hasher.finish())
}

/// A preflight's record without its progress.
fn preflight_outcome(preflight: &crate::api::PreflightStatus) -> String {
    let mut value = serde_json::to_value(preflight).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        for field in ["read", "message"] {
            fields.remove(field);
        }
    }
    value.to_string()
}

/// The predicate of the watch that reconciles the other policies for a policy's CRD: the
/// CRD it targets and its generation (a spec change, the start of its deletion), and while
/// it is being deleted every change (the last one, its removal, lets another take over).
pub fn competition(policy: &DeserializeGuard<VersionPolicy>) -> Option<u64> {
    let meta = policy.meta();
    let mut hasher = DefaultHasher::new();
    policy
        .0
        .as_ref()
        .map(|p| p.spec.crd_name.as_str())
        .unwrap_or_default()
        .hash(&mut hasher);
    meta.generation.hash(&mut hasher);
    if meta.deletion_timestamp.is_some() {
        meta.resource_version.hash(&mut hasher);
    }
    Some(hasher.finish())
}

/// A job's status without its progress.
fn job_outcome(job: Option<&MigrationStatus>) -> String {
    let Some(job) = job else {
        return String::new();
    };
    let mut value = serde_json::to_value(job).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        for field in PROGRESS_FIELDS {
            fields.remove(field);
        }
    }
    value.to_string()
}

/// What each policy's last reconcile acted on and wrote, by policy name: the CRD's
/// resourceVersion it decided on (a CRD event at that version is its own patch coming back,
/// or a state it already acted on: it starts no reconcile of that policy; any other change
/// of the CRD, by hand, by GitOps, the migrator's trim, does), and the policy's
/// resourceVersion after its status write (a cached policy at that version holds that
/// write, so the next reconcile needs no fresh read of the status it wrote). A cache of what
/// this process saw, never a fact another replica needs: without it, a CRD event costs one
/// reconcile more and a reconcile one read more.
#[derive(Debug, Default)]
pub struct LastReconciles {
    by_policy: Mutex<HashMap<String, Last>>,
}

#[derive(Debug, Default)]
struct Last {
    crd: Option<String>,
    status: Option<String>,
}

impl LastReconciles {
    /// The reconcile of `policy` acted on its CRD at `resource_version`.
    pub fn record_crd(&self, policy: &str, resource_version: &str) {
        lock(&self.by_policy).entry(policy.to_owned()).or_default().crd = Some(resource_version.to_owned());
    }

    /// Whether the last reconcile of `policy` acted on its CRD at `resource_version`.
    pub fn acted_on(&self, policy: &str, resource_version: &str) -> bool {
        lock(&self.by_policy)
            .get(policy)
            .and_then(|last| last.crd.as_deref())
            .is_some_and(|seen| seen == resource_version)
    }

    /// The reconcile of `policy` wrote its status, which left the policy at
    /// `resource_version`.
    pub fn record_status(&self, policy: &str, resource_version: &str) {
        lock(&self.by_policy).entry(policy.to_owned()).or_default().status =
            Some(resource_version.to_owned());
    }

    /// Whether the policy at `resource_version` holds the last status this process wrote.
    pub fn holds_own_status(&self, policy: &str, resource_version: &str) -> bool {
        lock(&self.by_policy)
            .get(policy)
            .and_then(|last| last.status.as_deref())
            .is_some_and(|written| written == resource_version)
    }

    /// The policy is gone.
    pub fn forget(&self, policy: &str) {
        lock(&self.by_policy).remove(policy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn policy(edit: impl FnOnce(&mut Value)) -> DeserializeGuard<VersionPolicy> {
        let mut policy = json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
            "metadata": {"name": "p", "generation": 1, "resourceVersion": "1"},
            "spec": {"crdName": "widgets.example.com", "versions": [{"name": "v1"}]}});
        edit(&mut policy);
        serde_json::from_value(policy).expect("decodes")
    }

    fn running(listed: u64) -> Value {
        json!({"phase": "Running", "storageVersion": "v1", "listed": listed, "rewritten": listed,
               "skipped": 0, "failed": 0, "progress": format!("{listed}/?")})
    }

    #[test]
    fn the_reconciles_own_writes_and_a_jobs_progress_change_nothing() {
        let created = policy_inputs(&policy(|_| {}));
        let own = policy(|p| {
            p["metadata"]["resourceVersion"] = json!("2");
            p["metadata"]["finalizers"] = json!(["crdlifecycle.io/release-crd"]);
            p["status"] = json!({"observedGeneration": 1, "conditions": [], "storageVersion": "v1"});
        });
        assert_eq!(policy_inputs(&own), created);
        let started = policy_inputs(&policy(|p| p["status"] = json!({"migration": running(0)})));
        assert_ne!(started, created);
        let progressed = policy_inputs(&policy(|p| p["status"] = json!({"migration": running(500)})));
        assert_eq!(progressed, started);
    }

    #[test]
    fn spec_deletion_approval_and_a_jobs_end_change_the_inputs() {
        let base = policy_inputs(&policy(|_| {}));
        for changed in [
            policy(|p| p["metadata"]["generation"] = json!(2)),
            policy(|p| p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z")),
            policy(|p| p["metadata"]["annotations"] = json!({APPROVE_ANNOTATION: "v1.deprecate"})),
            policy(|p| {
                let mut done = running(10);
                done["phase"] = json!("Succeeded");
                p["status"] = json!({"managedFieldsCleanup": done});
            }),
            policy(|p| {
                p["status"] =
                    json!({"preflight": {"version": "v1", "phase": "Running", "read": 0, "failed": 0}})
            }),
        ] {
            assert_ne!(policy_inputs(&changed), base, "{:?}", changed.0);
        }
    }

    /// A store waits for its preflight's objects checked recently: each check again (a new
    /// `verifiedAt`) starts a reconcile, the count of objects read so far does not.
    #[test]
    fn a_stores_preflight_checked_again_changes_the_inputs_its_progress_does_not() {
        let record = |read: u64, verified: &str| {
            policy(move |p| {
                p["status"] = json!({"preflights": [{"version": "v2", "phase": "Succeeded", "read": read,
                    "failed": 0, "message": format!("{read} read"), "verifiedAt": verified}]})
            })
        };
        let checked = policy_inputs(&record(100, "2026-01-01T00:00:00Z"));
        assert_ne!(checked, policy_inputs(&policy(|_| {})));
        assert_eq!(policy_inputs(&record(200, "2026-01-01T00:00:00Z")), checked);
        assert_ne!(policy_inputs(&record(200, "2026-01-01T00:00:30Z")), checked);
    }

    #[test]
    fn what_a_reconcile_acted_on_and_wrote_is_known_until_the_policy_goes() {
        let last = LastReconciles::default();
        last.record_crd("p", "42");
        last.record_status("p", "7");
        assert!(last.acted_on("p", "42") && last.holds_own_status("p", "7"));
        assert!(!last.acted_on("p", "43") && !last.holds_own_status("p", "8"));
        assert!(!last.acted_on("q", "42") && !last.holds_own_status("q", "7"));
        last.forget("p");
        assert!(!last.acted_on("p", "42") && !last.holds_own_status("p", "7"));
    }
}
