//! Findings from review (issue "Conditions and rotations that never lie"), each with the
//! test that fails without its fix.

use serde_json::json;

use super::{CRD, Harness, wait_until};

/// A dry run never migrates, so it never waits for a migration: once its patch is computed
/// it is Ready (reason DryRun), and kstatus and `kubectl wait --for=condition=Ready` settle.
#[tokio::test(start_paused = true)]
async fn a_dry_run_with_stale_stored_versions_is_ready() {
    let mut h = Harness::with_example_and_objects(20);
    h.edit_policy("widgets", |p| p["spec"]["dryRun"] = json!(true));
    // The CRD still lists v1alpha1 although v1beta1 stores: a migration would be due.
    h.fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][0]["storage"] = json!(false);
        crd["spec"]["versions"][1]["storage"] = json!(true);
        crd["status"]["storedVersions"] = json!(["v1alpha1", "v1beta1"]);
    });
    h.at("2026-02-15T00:00:00Z");
    h.reconcile("widgets").await;
    assert!(h.fake.crd_writes().is_empty(), "nothing applied");
    assert!(
        h.status("widgets")["dryRunPatch"].is_string(),
        "{:#}",
        h.status("widgets")
    );
    let (ready, reason, message) = h.condition("widgets", "Ready");
    assert_eq!((ready.as_str(), reason.as_str()), ("True", "DryRun"), "{message}");
    assert!(message.contains("status.dryRunPatch"), "{message}");
    assert_eq!(h.condition("widgets", "Reconciling").0, "False");
    assert_eq!(h.condition("widgets", "Stalled").0, "False");
    // And no migration was started.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(h.fake.object_requests().iter().all(|r| r.method == "GET"));
}

/// Sets up objects whose managedFields name v1alpha1, with v1alpha1 due for removal and
/// `storedVersions` already `[v1]`: only the managedFields cleanup holds the removal.
async fn awaiting_cleanup(objects: usize, prepare: impl FnOnce(&Harness)) -> Harness {
    let mut h = Harness::with_example_and_objects(objects);
    let keys = h.fake.object_keys(CRD);
    for (ns, name) in &keys {
        h.fake.set_managed_fields(
            CRD,
            ns,
            name,
            vec![
                json!({"apiVersion": "example.com/v1alpha1", "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:spec": {"f:size": {}}}, "manager": "gitops", "operation": "Apply"}),
            ],
        );
    }
    h.edit_policy(
        "widgets",
        |p| {
            p["spec"]["migration"] =
                json!({"enabled": false, "concurrency": 2, "pageSize": 50, "preflight": false})
        },
    );
    prepare(&h);
    h.at("2026-06-29T00:00:00Z");
    h.reconcile("widgets").await;
    h.trim_stored_versions(&["v1"]);
    h
}

/// A cleanup that fails after its bounded retries is Stalled, naming the object and the
/// apiserver's message, like a failed migration; not "entries are being rewritten" forever.
#[tokio::test(start_paused = true)]
async fn a_failed_managed_fields_cleanup_is_stalled_naming_the_objects() {
    let mut h = awaiting_cleanup(6, |h| {
        h.fake.set_fault(
            "ns1",
            "w00001",
            crate::apiserver::ObjectFault::Transient {
                code: 500,
                times: 10_000,
                retry_after: None,
            },
        )
    })
    .await;
    h.reconcile("widgets").await;
    // Reconciled right after the failure, before the (test's 100 ms) retry wait is over.
    wait_until("the cleanup fails", || {
        h.status("widgets")["managedFieldsCleanup"]["phase"] == "Failed"
    })
    .await;
    h.reconcile("widgets").await;
    let (stalled, reason, message) = h.condition("widgets", "Stalled");
    assert_eq!(
        (stalled.as_str(), reason.as_str()),
        ("True", "ManagedFieldsCleanupFailed"),
        "{message}: {:#}",
        h.status("widgets")
    );
    assert!(
        message.contains("ns1/w00001") && message.contains("500"),
        "{message}"
    );
    assert_eq!(h.condition("widgets", "Reconciling").0, "False");
    assert_eq!(h.flags(), "v1alpha1:d v1beta1:sd v1:sS", "the removal stays held");
}

/// Review: a cleanup of a version already gone from the CRD (the one after its removal)
/// that fails leaves objects no manager can server-side apply, though no removal waits for
/// it: it is Stalled too, naming the object.
#[tokio::test(start_paused = true)]
async fn a_failed_cleanup_of_a_version_gone_is_stalled() {
    let mut h = awaiting_cleanup(6, |_| {}).await;
    h.reconcile("widgets").await;
    wait_until("the cleanup before the removal succeeds", || {
        h.status("widgets")["managedFieldsCleanup"]["phase"] == "Succeeded"
    })
    .await;
    // After it, a write through a lagging apiserver names v1alpha1 again, on an object whose
    // every write now fails.
    h.fake.set_managed_fields(
        CRD,
        "ns1",
        "w00001",
        vec![
            json!({"apiVersion": "example.com/v1alpha1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:size": {}}}, "manager": "lagging", "operation": "Update"}),
        ],
    );
    h.fake.set_fault(
        "ns1",
        "w00001",
        crate::apiserver::ObjectFault::Transient {
            code: 500,
            times: 10_000,
            retry_after: None,
        },
    );
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1beta1:sd v1:sS", "v1alpha1 removed");
    wait_until("the cleanup after the removal fails", || {
        let cleanup = &h.status("widgets")["managedFieldsCleanup"];
        cleanup["phase"] == "Failed" && cleanup["goneVersions"] == json!(["v1alpha1"])
    })
    .await;
    h.reconcile("widgets").await;
    let (stalled, reason, message) = h.condition("widgets", "Stalled");
    assert_eq!(
        (stalled.as_str(), reason.as_str()),
        ("True", "ManagedFieldsCleanupFailed"),
        "{message}: {:#}",
        h.status("widgets")
    );
    assert!(message.contains("ns1/w00001"), "{message}");
}

/// A reconcile from a lagging cache, right after a cleanup succeeded, starts no second
/// full cleanup (the guard preflights have).
#[tokio::test(start_paused = true)]
async fn a_stale_cache_starts_no_second_cleanup() {
    use crd_lifecycle::api::VersionPolicy;
    use crd_lifecycle::controller::reconcile;
    use kube::core::DeserializeGuard;
    let stale = std::sync::Arc::new(std::sync::Mutex::new(None));
    let keep = stale.clone();
    // The cache as it is before the cleanup's status writes (captured before it starts).
    let h = awaiting_cleanup(40, move |h| {
        let policy: DeserializeGuard<VersionPolicy> =
            serde_json::from_value(h.fake.policy("widgets")).expect("decodes");
        *keep.lock().expect("lock") = Some(policy);
    })
    .await;
    wait_until("the cleanup succeeds", || {
        h.status("widgets")["managedFieldsCleanup"]["phase"] == "Succeeded"
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let lists = h.fake.metadata_lists().len();
    let stale = stale.lock().expect("lock").take().expect("captured");
    reconcile(std::sync::Arc::new(stale), h.ctx.clone())
        .await
        .expect("reconciles");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(
        h.fake.metadata_lists().len(),
        lists,
        "no second cleanup listed the objects"
    );
}

/// A grant revoked after the controller's cached check said "allowed": the run's own check
/// finds it missing. That is `MissingPermission` (Stalled, with the role to add, and a
/// Warning event of that reason), not a generic `MigrationFailed`, and the cached answer is
/// dropped, so the next reconcile asks the apiserver again.
#[tokio::test(start_paused = true)]
async fn a_revoked_permission_is_reported_as_missing_permission() {
    let mut h = Harness::with_example_and_objects(30);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("migrated to v1beta1", || {
        h.stored_versions() == json!(["v1beta1"])
    })
    .await;
    // Allowed, and cached; then revoked.
    h.fake.deny("patch", "example.com", "widgets", "");
    h.at("2026-02-01T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("the run ends", || {
        h.status("widgets")["migration"]["storageVersion"] == "v1"
            && h.status("widgets")["migration"]["phase"] == "Failed"
    })
    .await;
    assert!(
        h.status("widgets")["migration"]["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("missing permission on the objects of widgets.example.com: patch widgets"),
        "{:#}",
        h.status("widgets")["migration"]
    );
    assert!(
        h.fake
            .event_summaries()
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "MissingPermission"),
        "{:?}",
        h.fake.event_summaries()
    );
    // The next reconcile asks again (the cached "allowed" is gone) and blocks.
    let asked = h.fake.lock().access_reviews.len();
    h.reconcile("widgets").await;
    assert!(
        h.fake.lock().access_reviews.len() > asked,
        "asked the apiserver again"
    );
    assert_eq!(h.condition("widgets", "Stalled").1, "MissingPermission");
    assert_eq!(h.condition("widgets", "Blocked").1, "MissingPermission");
    assert!(
        h.fake
            .object_requests()
            .iter()
            .all(|r| r.method != "PATCH" || !r.path.contains("/v1/")),
        "nothing rewritten into v1"
    );
}

/// `migration_objects_remaining` has one series per job: a cleanup ending deletes its own,
/// never the running migration's.
#[test]
fn each_job_owns_its_remaining_objects_series() {
    use crd_lifecycle::controller::metrics::{JobLabels, Metrics};
    let metrics = Metrics::default();
    let job = |job: &str| JobLabels {
        crd: "widgets.example.com".into(),
        job: job.into(),
    };
    metrics
        .objects_remaining
        .get_or_create(&job("migration"))
        .set(700);
    metrics
        .objects_remaining
        .get_or_create(&job("managed_fields_cleanup"))
        .set(3);
    metrics.forget_job(&job("managed_fields_cleanup"));
    let text = metrics.encode();
    assert!(
        text.contains(
            r#"crd_lifecycle_migration_objects_remaining{crd="widgets.example.com",job="migration"} 700"#
        ),
        "{text}"
    );
    assert!(!text.contains(r#"job="managed_fields_cleanup"} 3"#), "{text}");
}

/// Gates that run ahead: a store's conversion preflight starts within a minute before its
/// instant, so the store lands on its instant, in the reconcile at that instant.
#[tokio::test(start_paused = true)]
async fn a_store_lands_on_its_instant_when_its_preflight_ran_ahead() {
    let mut h = Harness::with_example_and_objects(30);
    // v1beta1 is stored at 2026-01-05T00:00:00Z; 30 s before, the preflight starts.
    h.at("2026-01-04T23:59:30Z");
    let action = h.reconcile("widgets").await;
    wait_until("the preflight passes ahead of the store", || {
        h.preflight("widgets", "v1beta1")["phase"] == "Succeeded"
    })
    .await;
    assert_eq!(h.preflight("widgets", "v1beta1")["version"], "v1beta1");
    assert_eq!(
        h.flags(),
        "v1alpha1:sS v1beta1:s v1:-",
        "nothing switched before the instant"
    );
    // The controller wakes to check the objects are unchanged (10 s, and the time to list
    // 30 objects, before the instant), and one reconcile at the instant lands the store.
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_millis(19_971))
    );
    h.at("2026-01-04T23:59:49.970Z");
    h.reconcile("widgets").await;
    wait_until("the objects are checked again", || {
        // Status records whole seconds.
        h.preflight("widgets", "v1beta1")["verifiedAt"] == "2026-01-04T23:59:49Z"
    })
    .await;
    h.at("2026-01-05T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-", "stored at its instant");
    assert_ne!(h.condition("widgets", "Blocked").1, "AwaitingPreflight");
}
