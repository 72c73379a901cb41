//! `spec.migration.engine: StorageVersionMigration` against the fake's built-in migrator
//! (apiserver-samples/35), and the rule that never lets two migrators run at once.

use std::sync::Arc;
use std::time::Duration;

use crd_lifecycle::controller::jobs::BackgroundJobs;
use serde_json::{Value, json};

use super::{CRD, Harness, fast_settle_check, wait_until, yaml};

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
            .contains(
                "crd-lifecycle.widgets.example.com-v1beta1-1 failed: migration encountered unhandled error: failed to migrate 3 objects"
            ),
        "{}",
        migration(&h)
    );
    // Kubernetes trimmed storedVersions to [v1beta1] as the failed migration ended, with
    // every object still stored as v1alpha1 (tests/fixtures/svm-failed-trims-stored-versions.txt):
    // they list again what they listed when the migration was created, and it is marked.
    assert_eq!(h.stored_versions(), json!(["v1beta1", "v1alpha1"]));
    assert_eq!(
        h.fake.lock().svms["crd-lifecycle.widgets.example.com-v1beta1-1"]["metadata"]["annotations"]["crdlifecycle.io/stored-versions-restored"],
        "true"
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
    // The store itself waits (seed 378 of the simulation): Kubernetes' migrator would
    // rewrite through an apiserver still storing v1alpha1, then trim it.
    let (_, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(reason, "AwaitingMigration");
    assert!(
        message.contains("v1beta1 store waits until StorageVersionMigration someone-elses has finished"),
        "{message}"
    );
    assert_eq!(h.flags(), "v1alpha1:sS v1beta1:s v1:-");
    // Stored by hand meanwhile (kubectl edit): no migration of ours starts either.
    h.fake.lock().switch_storage("widgets.example.com", "v1beta1");
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

/// The policy's migration into v1beta1 (its store of 2026-01-05), created while the
/// kube-controller-manager's svm controller is idle: Pending. Its name.
async fn migration_pending_into_v1beta1(h: &mut Harness) -> &'static str {
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_paused = true;
    }
    builtin(h);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    h.reconcile("widgets").await;
    let pending = "crd-lifecycle.widgets.example.com-v1beta1-1";
    wait_until("the migration into v1beta1 is created", || {
        svm_names(h).contains(&pending.to_owned())
    })
    .await;
    pending
}

/// `kubectl edit`: v1 served and the storage version.
fn storage_moved_to_v1_by_hand(h: &Harness) {
    let mut state = h.fake.lock();
    let mut crd = state.crds[CRD].clone();
    for v in crd["spec"]["versions"].as_array_mut().expect("versions") {
        if v["name"] == "v1" {
            v["served"] = json!(true);
        }
    }
    state.store_crd(crd, true);
    state.switch_storage(CRD, "v1");
}

/// The next reconcile deletes the `pending` migration; then the svm controller runs, the
/// policy moves the storage version back to v1beta1 (its store of 2026-01-05), and a new
/// migration rewrites every one of the 10 objects into it (`rounds` reconciles 10 s apart).
async fn deleted_then_migrated_into_v1beta1(h: &mut Harness, pending: &str, rounds: usize) {
    h.reconcile("widgets").await;
    assert!(!svm_names(h).contains(&pending.to_owned()), "{:?}", svm_names(h));
    h.fake.lock().svm_paused = false;
    for _ in 0..rounds {
        h.reconcile("widgets").await;
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    wait_until("every object is migrated and storedVersions trimmed", || {
        h.stored_versions() == json!(["v1beta1"])
    })
    .await;
    assert_eq!(h.fake.encodings(CRD), [("v1beta1".to_owned(), 10)].into());
}

/// Found by the simulation (seed 924): this policy's StorageVersionMigration, created for
/// v1beta1 while the kube-controller-manager's svm controller was idle, is still Pending
/// when `kubectl edit` moves the storage version on to v1. Kubernetes' migrator would rewrite
/// into v1 once it starts, through apiservers nobody confirmed act on v1, and trim
/// storedVersions: the controller deletes it (a deleted Pending migration never runs,
/// tests/fixtures/apiserver/svm-delete-v1.36.txt) and migrates into v1 with a new one.
#[tokio::test(start_paused = true)]
async fn a_pending_migration_created_for_another_storage_version_is_deleted() {
    let mut h = Harness::with_example_and_objects(10);
    let pending = migration_pending_into_v1beta1(&mut h).await;
    // The controller restarts (its job no longer follows the migration), and the storage
    // version is moved on to v1 by hand before the svm controller picks anything up.
    h.ctx.jobs.shutdown();
    let fresh = BackgroundJobs::new(
        h.ctx.client.clone(),
        h.ctx.recorder.clone(),
        h.ctx.metrics.clone(),
        2,
    )
    .with_settle_check(super::fast_settle_check());
    h.replace_context(Arc::new(fresh), None);
    storage_moved_to_v1_by_hand(&h);
    deleted_then_migrated_into_v1beta1(&mut h, pending, 4).await;
}

/// Found by the simulation (a `kubectl edit` of the storage version while the policy's
/// StorageVersionMigration is Pending, the controller's job still following it): the first
/// fix of seed 924 kept a followed one, and Kubernetes' migrator started it after the edit,
/// through an apiserver lagging behind the edit. It is deleted too, the job ends, and the
/// next migration is created for the storage version as it is then.
#[tokio::test(start_paused = true)]
async fn a_pending_migration_followed_by_its_job_is_deleted_when_the_storage_version_moves() {
    let mut h = Harness::with_example_and_objects(10);
    let pending = migration_pending_into_v1beta1(&mut h).await;
    // `kubectl edit` moves the storage version on to v1 while the job follows it.
    storage_moved_to_v1_by_hand(&h);
    deleted_then_migrated_into_v1beta1(&mut h, pending, 6).await;
}

/// Review of the fix above: Kubernetes starts the policy's Pending migration between the
/// controller's list and its delete. A Running migration deleted goes on rewriting, unseen
/// (tests/fixtures/apiserver/svm-delete-v1.36.txt), so the delete carries the resourceVersion
/// listed: it answers 409 (tests/fixtures/apiserver/svm-delete-precondition-v1.36.txt) and
/// the migration is kept, and waited for as unfinished.
#[tokio::test(start_paused = true)]
async fn a_pending_migration_started_before_its_delete_is_kept() {
    let mut h = Harness::with_example_and_objects(4);
    let pending = migration_pending_into_v1beta1(&mut h).await;
    storage_moved_to_v1_by_hand(&h);
    let path = format!("/apis/storagemigration.k8s.io/v1beta1/storageversionmigrations/{pending}");
    h.fake.before_request(
        move |_, _, method, request_path| method == "DELETE" && request_path == path,
        0,
        |state| {
            state.svm_paused = false;
            state.svm_advance("crd-lifecycle.widgets.example.com-v1beta1-1");
            state.svm_paused = true;
        },
    );
    h.reconcile("widgets").await;
    assert!(
        h.fake.lock().svms.contains_key(pending),
        "started before the delete: kept {:?}",
        svm_names(&h)
    );
    assert!(
        h.fake.requests().iter().any(|r| r.method == "DELETE"),
        "the delete was sent"
    );
}

/// Issue 29, finding 2 (scenario 2): the built-in migration into v1beta1 succeeded long ago.
/// Then the storage version flips to v1alpha1 and back (a GitOps tool re-applies the old
/// CRD), and objects written meanwhile are stored as v1alpha1. The old `-v1beta1-1` belongs
/// to the CRD before the flip: it is not followed, a new attempt migrates those objects, and
/// only then is `storedVersions` trimmed.
#[tokio::test(start_paused = true)]
async fn a_succeeded_migration_from_before_a_flip_is_not_followed() {
    let mut h = Harness::with_example_and_objects(20);
    h.fake.lock().svm_served = true;
    builtin(&mut h);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("the first migration succeeds", || {
        migration(&h)["phase"] == "Succeeded"
    })
    .await;
    assert_eq!(h.stored_versions(), json!(["v1beta1"]));

    {
        let mut state = h.fake.lock();
        state.switch_storage(CRD, "v1alpha1");
        state.write_objects(CRD, 5);
        state.switch_storage(CRD, "v1beta1");
    }
    assert_eq!(h.stored_versions(), json!(["v1beta1", "v1alpha1"]));
    let flipped = h.fake.crd(CRD)["metadata"].clone();
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.reconcile("widgets").await;
    wait_until("storedVersions is trimmed", || {
        h.stored_versions() == json!(["v1beta1"])
    })
    .await;
    assert_eq!(
        h.fake.encodings(CRD),
        [("v1beta1".to_owned(), 20)].into(),
        "nothing left in a trimmed version"
    );
    wait_until("the next migration succeeds", || {
        migration(&h)["phase"] == "Succeeded"
            && migration(&h)["storageVersionMigration"] == "crd-lifecycle.widgets.example.com-v1beta1-2"
    })
    .await;
    assert_eq!(
        svm_names(&h),
        [
            "crd-lifecycle.widgets.example.com-v1beta1-1",
            "crd-lifecycle.widgets.example.com-v1beta1-2"
        ]
    );
    // The new attempt records the CRD it was created for.
    let second = h.fake.lock().svms["crd-lifecycle.widgets.example.com-v1beta1-2"].clone();
    let annotations = &second["metadata"]["annotations"];
    assert_eq!(
        annotations["crdlifecycle.io/crd-resource-version"],
        flipped["resourceVersion"]
    );
    assert_eq!(
        annotations["crdlifecycle.io/crd-generation"],
        flipped["generation"].to_string()
    );
    assert_eq!(annotations["crdlifecycle.io/stored-versions"], "v1beta1,v1alpha1");
}

/// A second CRD, `gadgets.example.com`, with its own policy (the internal migrator) and
/// `objects` stored as v1alpha1.
fn with_gadgets(h: &mut Harness, objects: usize) {
    let mut crd = yaml(include_str!("../../examples/widgets/crd.yaml"));
    crd["metadata"]["name"] = json!("gadgets.example.com");
    crd["spec"]["names"] =
        json!({"kind": "Gadget", "plural": "gadgets", "singular": "gadget", "listKind": "GadgetList"});
    h.fake.create_crd(crd);
    h.fake.add_objects("gadgets.example.com", objects, 2, "v1alpha1");
    let mut policy = yaml(include_str!("../../examples/widgets/policy.yaml"));
    policy["metadata"]["name"] = json!("gadgets");
    policy["spec"]["crdName"] = json!("gadgets.example.com");
    h.add_policy(policy, "2025-11-01T00:00:00Z");
}

/// Finding 3: the built-in migrator's API is served but its controller does not run, so the
/// migration stays Pending. Following it holds no migration slot (the only one here): another
/// policy's migration runs meanwhile. Past its deadline the run fails and the policy is
/// Stalled, saying the svm controller does not seem to run.
#[tokio::test(start_paused = true)]
async fn a_migration_never_picked_up_holds_no_slot_and_fails_at_its_deadline() {
    let mut h = Harness::with_example_and_objects(10);
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_paused = true;
    }
    let ctx = h.ctx.clone();
    let one_slot = BackgroundJobs::new(ctx.client.clone(), ctx.recorder.clone(), ctx.metrics.clone(), 1)
        .with_progress_interval(Duration::from_secs(1))
        .with_settle_check(fast_settle_check())
        .with_clock(ctx.clock.clone())
        .with_svm_pending_deadline(Duration::from_secs(600));
    h.replace_context(Arc::new(one_slot), None);
    builtin(&mut h);
    with_gadgets(&mut h, 10);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("the built-in migration is followed", || {
        migration(&h)["message"]
            .as_str()
            .unwrap_or_default()
            .contains("waiting for the kube-controller-manager's svm controller")
    })
    .await;

    h.reconcile_through_preflight("gadgets").await;
    let gadgets = h.fake.clone();
    wait_until("the other policy's migration ran", || {
        gadgets.crd("gadgets.example.com")["status"]["storedVersions"] == json!(["v1beta1"])
    })
    .await;
    assert_eq!(migration(&h)["phase"], "Running", "still waiting");

    tokio::time::sleep(Duration::from_secs(601)).await;
    wait_until("the migration failed", || migration(&h)["phase"] == "Failed").await;
    let message = migration(&h)["message"].as_str().unwrap_or_default().to_owned();
    assert!(
        message.contains("crd-lifecycle.widgets.example.com-v1beta1-1 has been Pending for")
            && message.contains("svm controller does not seem to run"),
        "{message}"
    );
    h.reconcile("widgets").await;
    let (stalled, reason, stalled_message) = h.condition("widgets", "Stalled");
    assert_eq!((stalled.as_str(), reason.as_str()), ("True", "MigrationFailed"));
    assert!(
        stalled_message.contains("svm controller does not seem to run"),
        "{stalled_message}"
    );
    assert_eq!(h.stored_versions(), json!(["v1alpha1", "v1beta1"]));
}

/// Finding 15: when the StorageVersionMigrations cannot be listed, whether another migrator
/// runs is unknown: no migration of ours starts (Blocked, checked again soon) until it is
/// known.
#[tokio::test(start_paused = true)]
async fn no_migration_starts_while_other_migrators_cannot_be_listed() {
    let mut h = Harness::with_example_and_objects(20);
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_list_fault = Some(503);
    }
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    // The store itself waits until it is known.
    let (blocked, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((blocked.as_str(), reason.as_str()), ("True", "AwaitingMigration"));
    assert!(
        message
            .contains("v1beta1 store waits until it is known whether a StorageVersionMigration of it runs"),
        "{message}"
    );
    // Stored by hand meanwhile: no migration of ours starts either.
    h.fake.lock().switch_storage("widgets.example.com", "v1beta1");
    h.reconcile_through_preflight("widgets").await;
    let (blocked, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((blocked.as_str(), reason.as_str()), ("True", "AwaitingMigration"));
    assert!(
        message.contains("cannot be told whether another migrator runs")
            && message.contains("cannot list StorageVersionMigrations"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        h.fake.object_requests().iter().all(|r| r.method == "GET"),
        "nothing rewritten"
    );
    assert_eq!(h.stored_versions(), json!(["v1alpha1", "v1beta1"]));
    // Known again: the next reconcile migrates.
    h.fake.lock().svm_list_fault = None;
    h.reconcile("widgets").await;
    wait_until("migrated", || h.stored_versions() == json!(["v1beta1"])).await;
}

/// The example walked, without migrations, to v1alpha1 unserved, its removal due next.
async fn unserved_with_its_removal_due() -> Harness {
    let mut h = Harness::with_example();
    h.edit_policy("widgets", |p| {
        p["spec"]["migration"]["enabled"] = json!(false);
    });
    for instant in [
        "2026-01-05T00:00:00Z",
        "2026-01-15T00:00:00Z",
        "2026-02-01T00:00:00Z",
        "2026-03-01T00:00:00Z",
        "2026-04-01T00:00:00Z",
        "2026-05-30T00:00:00Z",
    ] {
        h.at(instant);
        h.reconcile("widgets").await;
    }
    assert_eq!(h.flags(), "v1alpha1:d v1beta1:sd v1:sS");
    h
}

/// Walks the example to v1's store (2026-02-01), each store's migration succeeded.
async fn migrate_into_v1(h: &mut Harness) {
    for (instant, storage) in [
        ("2026-01-05T00:00:00Z", "v1beta1"),
        ("2026-01-15T00:00:00Z", "v1beta1"),
        ("2026-02-01T00:00:00Z", "v1"),
    ] {
        h.at(instant);
        h.reconcile_through_preflight("widgets").await;
        h.reconcile("widgets").await;
        wait_until("the migration succeeds", || {
            migration(h)["storageVersion"] == storage && migration(h)["phase"] == "Succeeded"
        })
        .await;
    }
}

/// Someone else's StorageVersionMigration `someone-elses` of the example's resource fails,
/// and Kubernetes processes its end (trimming `storedVersions`).
fn someone_elses_migration_fails(state: &mut crate::apiserver::State) {
    state
        .svm_fail_by_name
        .insert("someone-elses".into(), "conversion webhook failed".into());
    state.create_svm(json!({
        "apiVersion": "storagemigration.k8s.io/v1beta1", "kind": "StorageVersionMigration",
        "metadata": {"name": "someone-elses"},
        "spec": {"resource": {"group": "example.com", "resource": "widgets"}}}));
    for _ in 0..3 {
        state.svm_advance("someone-elses");
    }
}

/// A StorageVersionMigration of the example's resource that failed on 2026-06-27, its end
/// processed (`Running` False), as `kubectl get -o json` shows it; UID `uid-NAME`.
fn failed_migration(name: &str, labels: Value, annotations: Value) -> Value {
    json!({"apiVersion": "storagemigration.k8s.io/v1beta1", "kind": "StorageVersionMigration",
           "metadata": {"name": name, "uid": format!("uid-{name}"), "creationTimestamp": "2026-06-27T00:00:00Z",
                        "labels": labels, "annotations": annotations},
           "spec": {"resource": {"group": "example.com", "resource": "widgets"}},
           "status": {"conditions": [
               {"type": "Running", "status": "False", "reason": "MigrationCompleted",
                "lastTransitionTime": "2026-06-27T00:10:00Z"},
               {"type": "Failed", "status": "True", "reason": "StorageVersionMigrationFailed",
                "lastTransitionTime": "2026-06-27T00:10:00Z",
                "message": "migration encountered unhandled error: denied"}]}})
}

/// Kubernetes' migrator can trim `storedVersions` as a migration starts, before it has
/// rewritten the objects (seen on v1.36.2: `[v2]` 0.4 s after the second migration was
/// created, with 100 objects still stored as v1). So a due removal waits while any
/// StorageVersionMigration of the resource is unfinished, whoever made it.
#[tokio::test(start_paused = true)]
async fn no_removal_lands_while_a_storage_version_migration_is_unfinished() {
    let mut h = unserved_with_its_removal_due().await;
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_paused = true;
        state.svms.insert(
            "someone-elses".into(),
            json!({"apiVersion": "storagemigration.k8s.io/v1beta1", "kind": "StorageVersionMigration",
                   "metadata": {"name": "someone-elses", "creationTimestamp": "2026-06-28T00:00:00Z"},
                   "spec": {"resource": {"group": "example.com", "resource": "widgets"}},
                   "status": {"conditions": [{"type": "Running", "status": "True", "reason": "MigrationRunning"}]}}),
        );
    }
    // The API was just enabled: the "not served" answer of the walk stands 5 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    // It trimmed storedVersions as it started.
    h.trim_stored_versions(&["v1"]);
    h.at("2026-06-29T00:00:00Z");
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(
        h.flags(),
        "v1alpha1:d v1beta1:sd v1:sS",
        "v1alpha1 is not removed"
    );
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "AwaitingMigration"));
    assert!(
        message
            .contains("removal of v1alpha1 waits until StorageVersionMigration someone-elses has finished"),
        "{message}"
    );

    // It finishes: the removal lands.
    if let Some(svm) = h.fake.lock().svms.get_mut("someone-elses") {
        svm["status"]["conditions"] =
            json!([{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}]);
    }
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(h.flags(), "v1beta1:sd v1:sS");
}

/// Kubernetes trims `storedVersions` as a failed migration ends too, with objects still
/// stored in the versions it removed (tests/fixtures/svm-failed-trims-stored-versions.txt).
/// A failed migration of the policy's own gets them back before any removal; one of
/// someone else's (what it trimmed unknown) gets every version listed again, and holds every
/// removal until a migration started after it succeeded.
#[tokio::test(start_paused = true)]
async fn a_failed_storage_version_migration_holds_removals_until_what_it_trimmed_is_safe() {
    let mut h = unserved_with_its_removal_due().await;
    let failed = failed_migration;
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_paused = true;
        state.svms.insert(
            "ours".into(),
            failed(
                "ours",
                json!({"crdlifecycle.io/policy": "widgets", "crdlifecycle.io/storage-version": "v1"}),
                json!({"crdlifecycle.io/crd-resource-version": "1", "crdlifecycle.io/crd-generation": "1",
                       "crdlifecycle.io/stored-versions": "v1alpha1,v1beta1,v1"}),
            ),
        );
    }
    // The API was just enabled: the "not served" answer of the walk stands 5 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Kubernetes trimmed storedVersions as ours failed.
    h.trim_stored_versions(&["v1"]);
    h.at("2026-06-29T00:00:00Z");
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(
        h.flags(),
        "v1alpha1:d v1beta1:sd v1:sS",
        "v1alpha1 is not removed"
    );
    assert_eq!(h.stored_versions(), json!(["v1", "v1alpha1", "v1beta1"]));
    assert_eq!(
        h.fake.lock().svms["ours"]["metadata"]["annotations"]["crdlifecycle.io/stored-versions-restored"],
        "true"
    );

    // Someone else's failed migration, its storedVersions unknown: removals are held until a
    // migration started after it succeeds. This policy does not migrate (its migration is
    // off), so it leaves storedVersions to whoever does and says what to do.
    h.fake.lock().svms.insert(
        "someone-elses".into(),
        failed("someone-elses", json!({}), json!({})),
    );
    h.trim_stored_versions(&["v1"]);
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(
        h.flags(),
        "v1alpha1:d v1beta1:sd v1:sS",
        "v1alpha1 is not removed"
    );
    assert_eq!(
        h.stored_versions(),
        json!(["v1"]),
        "not this policy's to list again"
    );
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "AwaitingMigration"));
    assert!(
        message.contains(
            "StorageVersionMigration someone-elses, which failed, is followed by a migration that succeeds, or is \
             deleted once every object of widgets.example.com is rewritten (`crd-lifecycle migrate"
        ),
        "{message}"
    );
    h.fake.lock().svms.insert(
        "later".into(),
        json!({"apiVersion": "storagemigration.k8s.io/v1beta1", "kind": "StorageVersionMigration",
               "metadata": {"name": "later", "creationTimestamp": "2026-06-28T00:00:00Z"},
               "spec": {"resource": {"group": "example.com", "resource": "widgets"}},
               "status": {"conditions": [{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}]}}),
    );
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(h.flags(), "v1beta1:sd v1:sS");
}

/// The end of a failed migration processed late (after the follower stopped waiting for
/// it): the next reconcile lists again what Kubernetes trimmed, without a removal being due
/// (a migration deleted meanwhile would take the knowledge with it).
#[tokio::test(start_paused = true)]
async fn a_failed_migration_whose_end_comes_late_is_restored_at_the_next_reconcile() {
    let mut h = Harness::with_example_and_objects(10);
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_fail = Some("denied".into());
    }
    builtin(&mut h);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    let name = "crd-lifecycle.widgets.example.com-v1beta1-1";
    let failed_not_ended = |h: &Harness| {
        let state = h.fake.lock();
        let conditions = state.svms.get(name).map(|s| s["status"]["conditions"].clone());
        conditions.is_some_and(|c| {
            let is = |kind: &str| {
                c.as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == kind && c["status"] == "True")
            };
            is("Failed") && is("Running")
        })
    };
    wait_until("failed, its end still to come", || failed_not_ended(&h)).await;
    // The kube-controller-manager is slow to process the end.
    h.fake.lock().svm_paused = true;
    tokio::time::sleep(std::time::Duration::from_secs(61)).await;
    wait_until("the follower gives up waiting", || {
        migration(&h)["phase"] == "Failed"
    })
    .await;
    assert_eq!(
        h.stored_versions(),
        json!(["v1alpha1", "v1beta1"]),
        "nothing trimmed yet"
    );

    // It processes the end (trimming), and the next reconcile restores what it listed; the
    // CRD's record of the failure, which no run covers, also lists every version it has (v1,
    // introduced since: the next attempt finds nothing stored there and trims it).
    h.fake.lock().svm_paused = false;
    h.reconcile("widgets").await;
    assert_eq!(h.stored_versions(), json!(["v1beta1", "v1alpha1", "v1"]));
    assert_eq!(
        h.fake.lock().svms[name]["metadata"]["annotations"]["crdlifecycle.io/stored-versions-restored"],
        "true"
    );
}

/// Issue 34, finding 1: someone else's failed migration trimmed `storedVersions` with objects
/// still stored in what it dropped. A run of this policy's own that started after the failure
/// ended releases that hold only if it rewrote every object: one that found `storedVersions`
/// trimmed already (by that very failure) rewrote nothing, and used to release it.
#[tokio::test(start_paused = true)]
async fn only_a_run_that_rewrote_every_object_releases_a_failed_migrations_hold() {
    let mut h = unserved_with_its_removal_due().await;
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_paused = true;
        state.svms.insert(
            "someone-elses".into(),
            failed_migration("someone-elses", json!({}), json!({})),
        );
    }
    // The API was just enabled: the "not served" answer of the walk stands 5 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    h.trim_stored_versions(&["v1"]);
    let run = |rewrote_all: bool, covers: Value| {
        json!({"migration": {"phase": "Succeeded", "storageVersion": "v1",
                             "startedAt": "2026-06-28T00:00:00Z", "finishedAt": "2026-06-28T00:00:01Z",
                             "rewroteAll": rewrote_all, "coversFailedMigrations": covers}})
    };
    // A run after the failure that found storedVersions trimmed: it rewrote nothing.
    h.apply_status_as(
        crd_lifecycle::controller::jobs::MIGRATION_FIELD_MANAGER,
        run(false, json!(["uid-someone-elses"])),
    )
    .await;
    h.at("2026-06-29T00:00:00Z");
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(
        h.flags(),
        "v1alpha1:d v1beta1:sd v1:sS",
        "v1alpha1 is not removed"
    );
    let (_, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(reason, "AwaitingMigration");
    assert!(message.contains("someone-elses, which failed"), "{message}");
    // Review finding F4: a run that rewrote every object and started after the failure
    // ended, by the controller's clock, but had not seen it processed when it listed (the
    // controller's clock ahead of the kube-controller-manager's): it covers nothing.
    h.apply_status_as(
        crd_lifecycle::controller::jobs::MIGRATION_FIELD_MANAGER,
        run(true, json!([])),
    )
    .await;
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(
        h.flags(),
        "v1alpha1:d v1beta1:sd v1:sS",
        "v1alpha1 is not removed"
    );
    // A run that had seen the failure processed before it listed, and rewrote every object
    // (and trimmed): the removal lands.
    h.apply_status_as(
        crd_lifecycle::controller::jobs::MIGRATION_FIELD_MANAGER,
        run(true, json!(["uid-someone-elses"])),
    )
    .await;
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(h.flags(), "v1beta1:sd v1:sS");
}

/// Review finding F4: someone else's failed migration trimmed `storedVersions` with objects
/// still stored in what it dropped. The controller lists every version again, and the next
/// run records the failure as seen processed before it listed its first object; having
/// rewritten every object, it releases the hold. The controller's clock is never compared
/// with the kube-controller-manager's.
#[tokio::test(start_paused = true)]
async fn someone_elses_failure_is_covered_by_the_next_full_run_that_saw_it_end() {
    let mut h = unserved_with_its_removal_due().await;
    h.fake.add_objects(CRD, 10, 2, "v1alpha1");
    h.edit_policy("widgets", |p| p["spec"]["migration"]["enabled"] = json!(true));
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        state.svm_paused = true;
        state.svms.insert(
            "someone-elses".into(),
            failed_migration("someone-elses", json!({}), json!({})),
        );
    }
    // The API was just enabled: the "not served" answer of the walk stands 5 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    h.trim_stored_versions(&["v1"]);
    h.at("2026-06-29T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(
        h.flags(),
        "v1alpha1:d v1beta1:sd v1:sS",
        "v1alpha1 is not removed"
    );
    assert_eq!(h.stored_versions(), json!(["v1", "v1alpha1", "v1beta1"]));
    // The next reconcile (the CRD's change) starts a run, which covers the failure.
    h.reconcile("widgets").await;
    wait_until("the run succeeds", || migration(&h)["phase"] == "Succeeded").await;
    assert_eq!(
        migration(&h)["coversFailedMigrations"],
        json!(["uid-someone-elses"]),
        "{:#}",
        migration(&h)
    );
    assert_eq!(h.stored_versions(), json!(["v1"]));
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(h.flags(), "v1beta1:sd v1:sS");
    assert_eq!(h.fake.encodings(CRD), [("v1".to_owned(), 10)].into());
}

/// Review: someone else's migration failed, trimming `storedVersions` with objects still
/// stored in what it dropped, and its owner deleted it before any removal was due (or while
/// no controller ran). The CRD keeps the record (`StorageMigrating` `MigrationFailed`, the
/// same write as the trim): every version is listed again at the next reconcile, whatever is
/// due, the migration that follows rewrites those objects and records the failure as covered,
/// and nothing is listed again after it.
#[tokio::test(start_paused = true)]
async fn a_failure_the_crd_records_is_listed_again_after_its_migration_is_deleted() {
    let mut h = Harness::with_example_and_objects(10);
    h.fake.lock().svm_served = true;
    migrate_into_v1(&mut h).await;
    // `kubectl edit` flips the storage version back to v1beta1 and forth again, three
    // objects written in between.
    {
        let mut state = h.fake.lock();
        state.switch_storage(CRD, "v1beta1");
        state.write_objects(CRD, 3);
        state.switch_storage(CRD, "v1");
    }
    assert_eq!(h.stored_versions(), json!(["v1", "v1beta1"]));
    assert_eq!(
        h.fake.encodings(CRD),
        [("v1".to_owned(), 7), ("v1beta1".to_owned(), 3)].into()
    );
    // Someone else's migration fails, its end trims storedVersions, and its owner deletes
    // it, before the controller looks.
    someone_elses_migration_fails(&mut h.fake.lock());
    assert_eq!(h.stored_versions(), json!(["v1"]), "trimmed by the failure");
    h.fake.lock().svms.remove("someone-elses");
    // No removal due for months.
    h.at("2026-03-01T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.stored_versions(), json!(["v1", "v1alpha1", "v1beta1"]));
    h.reconcile("widgets").await;
    wait_until("the migration rewrites every object", || {
        h.fake.encodings(CRD) == [("v1".to_owned(), 10)].into() && h.stored_versions() == json!(["v1"])
    })
    .await;
    wait_until("the run is recorded", || migration(&h)["phase"] == "Succeeded").await;
    assert!(
        migration(&h)["coversFailedMigrationOnCrd"]
            .as_str()
            .is_some_and(|record| record.contains("The migration has failed")),
        "{:#}",
        migration(&h)
    );
    // Covered: not listed again.
    h.reconcile("widgets").await;
    assert_eq!(h.stored_versions(), json!(["v1"]));
    for instant in [
        "2026-04-01T00:00:00Z",
        "2026-05-30T00:00:00Z",
        "2026-06-29T00:00:00Z",
    ] {
        h.at(instant);
        h.reconcile_through_cleanup("widgets").await;
    }
    assert_eq!(h.flags(), "v1beta1:sd v1:sS");
    assert_eq!(h.fake.encodings(CRD), [("v1".to_owned(), 10)].into());
}

/// Review finding F4's last window, as near as a real sequence gets to it: v1alpha1's
/// removal is due and its managedFields cleanup has ended when the storage version is flipped
/// back to it and forth with writes between, and someone else's failed migration trims
/// storedVersions and is deleted before the controller looks. The removal waits (the flip
/// asks for a new cleanup, and the CRD's record lists every version again, in whichever
/// order the reconcile meets them), and the migration that follows rewrites the objects the
/// failure left in v1alpha1 before it goes.
#[tokio::test(start_paused = true)]
async fn a_removal_due_after_a_recorded_failure_waits_for_the_next_migration() {
    let mut h = Harness::with_example_and_objects(10);
    h.fake.lock().svm_served = true;
    migrate_into_v1(&mut h).await;
    for instant in [
        "2026-03-01T00:00:00Z",
        "2026-04-01T00:00:00Z",
        "2026-05-30T00:00:00Z",
    ] {
        h.at(instant);
        h.reconcile("widgets").await;
    }
    assert_eq!(h.flags(), "v1alpha1:d v1beta1:sd v1:sS");
    // v1alpha1's removal is due; it waits for the managedFields cleanup, which ends.
    h.at("2026-06-29T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(
        h.condition("widgets", "Blocked").1,
        "AwaitingManagedFieldsCleanup"
    );
    let fake = h.fake.clone();
    wait_until("the managedFields cleanup ends", || {
        fake.policy("widgets")["status"]["managedFieldsCleanup"]["phase"] == "Succeeded"
    })
    .await;
    // Before the controller looks again: `kubectl edit` flips the storage version to
    // v1alpha1 (no longer served: the apiserver allows it, validation.go asks only for exactly
    // one storage version) and back, three objects written in between through v1; someone
    // else's migration fails, its end trims storedVersions, and its owner deletes it.
    {
        let mut state = h.fake.lock();
        state.switch_storage(CRD, "v1alpha1");
        state.write_objects(CRD, 3);
        state.switch_storage(CRD, "v1");
    }
    someone_elses_migration_fails(&mut h.fake.lock());
    h.fake.lock().svms.remove("someone-elses");
    assert_eq!(h.stored_versions(), json!(["v1"]), "trimmed by the failure");
    assert_eq!(
        h.fake.encodings(CRD),
        [("v1".to_owned(), 7), ("v1alpha1".to_owned(), 3)].into()
    );
    // The reconcile that first sees the CRD's record is the one at which the removal is due.
    h.reconcile("widgets").await;
    assert!(
        h.flags().contains("v1alpha1:"),
        "v1alpha1 removed over 3 objects stored in it: {}",
        h.flags()
    );
    assert_eq!(h.stored_versions(), json!(["v1", "v1alpha1", "v1beta1"]));
    for _ in 0..3 {
        h.reconcile_through_cleanup("widgets").await;
        wait_until("the run is recorded", || migration(&h)["phase"] == "Succeeded").await;
    }
    assert_eq!(h.fake.encodings(CRD), [("v1".to_owned(), 10)].into());
    assert_eq!(h.flags(), "v1beta1:sd v1:sS");
}

/// Found by the simulation (seed 26): with the built-in engine, after someone else's
/// migration failed, the controller listed every version again, and its job reused its own
/// migration that had succeeded before that failure (the CRD's generation unchanged): the
/// trim followed at once, the failure stayed unsuperseded, and the two alternated forever.
/// The job creates the next attempt instead, which supersedes the failure.
#[tokio::test(start_paused = true)]
async fn after_someone_elses_failure_the_built_in_job_migrates_again_instead_of_reusing() {
    let mut h = Harness::with_example_and_objects(10);
    h.fake.lock().svm_served = true;
    builtin(&mut h);
    migrate_into_v1(&mut h).await;
    let first = "crd-lifecycle.widgets.example.com-v1-1";
    assert_eq!(
        migration(&h)["storageVersionMigration"],
        first,
        "{} {:?}",
        h.flags(),
        h.condition("widgets", "Blocked")
    );
    for instant in [
        "2026-03-01T00:00:00Z",
        "2026-04-01T00:00:00Z",
        "2026-05-30T00:00:00Z",
    ] {
        h.at(instant);
        h.reconcile("widgets").await;
    }
    assert_eq!(h.flags(), "v1alpha1:d v1beta1:sd v1:sS");
    // Someone else's migration fails after ours succeeded; its end trims storedVersions.
    tokio::time::sleep(Duration::from_secs(2)).await;
    someone_elses_migration_fails(&mut h.fake.lock());
    tokio::time::sleep(Duration::from_secs(2)).await;
    h.at("2026-06-29T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.stored_versions(), json!(["v1", "v1alpha1", "v1beta1"]));
    h.reconcile("widgets").await;
    let second = "crd-lifecycle.widgets.example.com-v1-2";
    wait_until("the next attempt succeeds", || {
        migration(&h)["storageVersionMigration"] == second && migration(&h)["phase"] == "Succeeded"
    })
    .await;
    assert_eq!(h.stored_versions(), json!(["v1"]));
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(h.flags(), "v1beta1:sd v1:sS");
    assert_eq!(h.stored_versions(), json!(["v1"]), "not listed again");
}

/// Review finding: the built-in engine's job settles for seconds before it creates its
/// StorageVersionMigration; a store due meanwhile waits for it (and for the migration once
/// created), or the migration would run at the later storage version through an apiserver
/// still storing the earlier one, and trim it.
#[tokio::test(start_paused = true)]
async fn a_store_waits_for_this_controllers_own_built_in_migration_from_its_first_step() {
    let mut h = Harness::with_example_and_objects(10);
    {
        let mut state = h.fake.lock();
        state.svm_served = true;
        // The svm controller has not picked anything up yet.
        state.svm_paused = true;
    }
    builtin(&mut h);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-");
    // v1 introduced, then its store due while the job of v1beta1 is under way.
    h.at("2026-01-15T00:00:00Z");
    h.reconcile("widgets").await;
    h.at("2026-02-01T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    let (_, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(reason, "AwaitingMigration", "{message}");
    assert!(
        message.contains("v1 store waits until")
            && (message
                .contains("this controller's StorageVersionMigration of widgets.example.com into v1beta1")
                || message.contains(
                    "StorageVersionMigration crd-lifecycle.widgets.example.com-v1beta1-1 has finished"
                )),
        "{message}"
    );
    assert_eq!(
        h.flags(),
        "v1alpha1:s v1beta1:sS v1:s",
        "v1beta1 stays the storage version"
    );
    // The migration runs and succeeds: the store lands.
    h.fake.lock().svm_paused = false;
    wait_until("the built-in migration succeeds", || {
        migration(&h)["phase"] == "Succeeded"
    })
    .await;
    h.reconcile_through_preflight("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:s v1:sS");
}
