//! `spec.migration.engine: StorageVersionMigration` against the fake's built-in migrator
//! (apiserver-samples/35), and the rule that never lets two migrators run at once.

use serde_json::{Value, json};

use super::{CRD, Harness, wait_until};

fn migration(h: &Harness) -> Value {
    h.status("widgets")["migration"].clone()
}

fn builtin(h: &mut Harness) {
    h.edit_policy("widgets", |p| {
        p["spec"]["migration"]["engine"] = json!("StorageVersionMigration");
    });
}

fn svm_names(h: &Harness) -> Vec<String> {
    h.fake.lock().svms.keys().cloned().collect()
}

#[tokio::test(start_paused = true)]
async fn the_built_in_migrator_runs_the_migration_and_trims() {
    let mut h = Harness::with_example_and_objects(40);
    h.fake.lock().svm_served = true;
    builtin(&mut h);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("the built-in migration succeeds", || {
        migration(&h)["phase"] == "Succeeded"
    })
    .await;

    // One StorageVersionMigration, named deterministically, labelled with the policy.
    let name = "crd-lifecycle.widgets.example.com-v1beta1-1";
    assert_eq!(svm_names(&h), [name]);
    let svm = h.fake.lock().svms[name].clone();
    assert_eq!(
        svm["spec"]["resource"],
        json!({"group": "example.com", "resource": "widgets"})
    );
    assert_eq!(svm["metadata"]["labels"]["crdlifecycle.io/policy"], "widgets");
    assert_eq!(
        svm["metadata"]["labels"]["crdlifecycle.io/storage-version"],
        "v1beta1"
    );

    let status = migration(&h);
    assert_eq!(status["storageVersionMigration"], name);
    assert_eq!(status["storageVersion"], "v1beta1");
    assert!(
        status["startedAt"].is_string() && status["finishedAt"].is_string(),
        "{status}"
    );
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .contains("succeeded; status.storedVersions is [v1beta1] (trimmed by the built-in migrator)"),
        "{status}"
    );
    // The built-in controller rewrote and trimmed; the operator wrote no object.
    assert_eq!(h.stored_versions(), json!(["v1beta1"]));
    assert_eq!(h.fake.encodings(CRD), [("v1beta1".to_owned(), 40)].into());
    assert!(
        h.fake.object_requests().iter().all(|r| r.method == "GET"),
        "only the preflight's reads"
    );
    let events = h.fake.event_summaries();
    for reason in ["MigrationStarted", "MigrationSucceeded"] {
        assert!(
            events.iter().any(|(_, r, _)| r == reason),
            "{reason} in {events:?}"
        );
    }
    assert!(
        h.ctx
            .metrics
            .encode()
            .contains(r#"crd_lifecycle_migrations_total{crd="widgets.example.com",result="succeeded"} 1"#)
    );
    // AwaitingMigration lifts: the CRD is as the policy says.
    h.reconcile("widgets").await;
    assert_eq!(h.condition("widgets", "Blocked").0, "False");
}

#[tokio::test(start_paused = true)]
async fn the_operator_trims_when_the_built_in_migrator_did_not() {
    let mut h = Harness::with_example_and_objects(10);
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_leaves_stored_versions = true;
    }
    builtin(&mut h);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("succeeded", || migration(&h)["phase"] == "Succeeded").await;
    assert_eq!(h.stored_versions(), json!(["v1beta1"]));
    assert!(
        migration(&h)["message"]
            .as_str()
            .unwrap_or_default()
            .contains("status.storedVersions trimmed from [v1alpha1, v1beta1] to [v1beta1]"),
        "{}",
        migration(&h)
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_built_in_migration_is_stalled_and_the_next_attempt_is_a_new_object() {
    let mut h = Harness::with_example_and_objects(10);
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_fail = Some("failed to migrate 3 objects".into());
    }
    builtin(&mut h);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("failed", || migration(&h)["phase"] == "Failed").await;
    assert!(
        migration(&h)["message"]
            .as_str()
            .unwrap_or_default()
            .contains("crd-lifecycle.widgets.example.com-v1beta1-1 failed: failed to migrate 3 objects"),
        "{}",
        migration(&h)
    );
    h.reconcile("widgets").await;
    assert_eq!(
        h.condition("widgets", "Stalled").0,
        "True",
        "{:#}",
        h.status("widgets")
    );
    assert!(
        h.fake
            .event_summaries()
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "MigrationFailed")
    );

    // After the retry wait (by the failure's finishedAt, on the controller's clock), a new
    // attempt is a new object.
    h.fake.lock().svm_fail = None;
    tokio::time::sleep(std::time::Duration::from_secs(301)).await;
    h.at("2026-01-05T00:05:01Z");
    h.reconcile("widgets").await;
    wait_until("succeeded", || migration(&h)["phase"] == "Succeeded").await;
    assert_eq!(
        svm_names(&h),
        [
            "crd-lifecycle.widgets.example.com-v1beta1-1",
            "crd-lifecycle.widgets.example.com-v1beta1-2"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn without_the_api_the_policy_is_blocked_saying_how_to_enable_it() {
    let mut h = Harness::with_example_and_objects(10);
    builtin(&mut h);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    let (blocked, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(
        (blocked.as_str(), reason.as_str()),
        ("True", "StorageVersionMigrationUnavailable")
    );
    assert!(
        message.contains("does not serve storagemigration.k8s.io") && message.contains("--controllers=*,svm"),
        "{message}"
    );
    assert_eq!(h.condition("widgets", "Stalled").0, "True");
    assert!(
        h.fake.object_requests().iter().all(|r| r.method == "GET"),
        "nothing rewritten"
    );
    assert_eq!(h.stored_versions(), json!(["v1alpha1", "v1beta1"]));
}

#[tokio::test(start_paused = true)]
async fn no_migration_starts_while_another_migrator_runs() {
    let mut h = Harness::with_example_and_objects(20);
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_paused = true;
        // Someone else's migration of the same resource, not finished.
        state.svms.insert(
            "someone-elses".into(),
            json!({"apiVersion": "storagemigration.k8s.io/v1beta1", "kind": "StorageVersionMigration",
                   "metadata": {"name": "someone-elses", "creationTimestamp": "2026-01-04T00:00:00Z"},
                   "spec": {"resource": {"group": "example.com", "resource": "widgets"}},
                   "status": {"conditions": [{"type": "Running", "status": "True", "reason": "MigrationRunning"}]}}),
        );
    }
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    let blocked = h.status("widgets")["conditions"].clone();
    assert!(
        blocked.to_string().contains(
            "waiting for StorageVersionMigration someone-elses of widgets.example.com to finish before migrating"
        ),
        "{blocked:#}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        h.fake.object_requests().iter().all(|r| r.method == "GET"),
        "the internal migrator did not start"
    );
    // It finishes: the next reconcile migrates.
    {
        let mut state = h.fake.lock();
        state.svm_paused = false;
        if let Some(svm) = state.svms.get_mut("someone-elses") {
            svm["status"]["conditions"] = json!([{"type": "Succeeded", "status": "True"}]);
        }
    }
    h.reconcile("widgets").await;
    wait_until("migrated", || h.stored_versions() == json!(["v1beta1"])).await;
}
