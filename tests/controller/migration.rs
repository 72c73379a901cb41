//! The controller running storage-version migrations in the background.

use std::sync::Arc;
use std::time::Duration;

use crd_lifecycle::controller::jobs::BackgroundJobs;
use serde_json::{Value, json};

use super::{CRD, Harness, wait_until};
use crate::apiserver::ObjectFault;

fn migration(h: &Harness) -> Value {
    h.status("widgets")["migration"].clone()
}

#[tokio::test(start_paused = true)]
async fn a_due_removal_waits_for_the_migration_then_proceeds() {
    let mut h = Harness::with_example_and_objects(1200);
    // Everything up to v1alpha1's removal is due at once.
    h.at("2026-06-29T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    assert_eq!(
        h.flags(),
        "v1alpha1:d v1beta1:sd v1:sS",
        "removal held: {:#}",
        h.status("widgets")
    );
    assert_eq!(h.condition("widgets", "Blocked").1, "AwaitingMigration");
    let (reconciling, reason, _) = h.condition("widgets", "Reconciling");
    assert_eq!((reconciling.as_str(), reason.as_str()), ("True", "Migrating"));
    assert_eq!(
        h.condition("widgets", "Ready").0,
        "False",
        "not Ready while migrating"
    );
    assert_eq!(h.condition("widgets", "Stalled").0, "False");

    wait_until("the migration succeeds", || migration(&h)["phase"] == "Succeeded").await;
    let status = migration(&h);
    assert_eq!(status["storageVersion"], "v1");
    assert_eq!(status["rewritten"], 1200);
    assert_eq!(status["total"], 1200);
    assert_eq!(status["progress"], "1200/1200", "the `kubectl get` column");
    assert!(
        status["message"]
            .as_str()
            .unwrap_or_default()
            .contains("trimmed from [v1alpha1, v1] to [v1]"),
        "{status}"
    );
    assert_eq!(h.stored_versions(), json!(["v1"]));
    assert_eq!(h.fake.encodings(CRD), [("v1".to_owned(), 1200)].into());

    // The trim is a CRD change: the next reconcile removes v1alpha1 (after the managedFields
    // cleanup it starts).
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(h.flags(), "v1beta1:sd v1:sS");
    assert_eq!(h.condition("widgets", "Blocked").0, "False");
    let events = h.fake.event_summaries();
    for reason in ["MigrationStarted", "MigrationSucceeded", "VersionRemoved"] {
        assert!(
            events.iter().any(|(_, r, _)| r == reason),
            "{reason} in {events:?}"
        );
    }
    let metrics = h.ctx.metrics.encode();
    assert!(
        metrics.contains(r#"crd_lifecycle_migration_objects_migrated_total{crd="widgets.example.com"} 1200"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"crd_lifecycle_migrations_total{crd="widgets.example.com",result="succeeded"} 1"#)
    );
}

#[tokio::test(start_paused = true)]
async fn each_store_transition_is_followed_by_a_migration() {
    let mut h = Harness::with_example_and_objects(300);
    h.at("2026-01-05T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("migrated to v1beta1", || {
        h.stored_versions() == json!(["v1beta1"])
    })
    .await;
    assert_eq!(h.fake.encodings(CRD), [("v1beta1".to_owned(), 300)].into());

    h.at("2026-02-01T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("migrated to v1", || h.stored_versions() == json!(["v1"])).await;
    assert_eq!(h.fake.encodings(CRD), [("v1".to_owned(), 300)].into());
    wait_until("status written", || {
        migration(&h)["storageVersion"] == "v1" && migration(&h)["phase"] == "Succeeded"
    })
    .await;

    // Nothing is left to migrate: later reconciles start nothing.
    h.fake.clear_requests();
    h.reconcile("widgets").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(h.fake.object_requests().is_empty());
    // Idle and healthy: what `kubectl wait --for=condition=Ready` waits for.
    assert_eq!(h.condition("widgets", "Reconciling").1, "Idle");
    assert_eq!(h.condition("widgets", "Reconciling").0, "False");
    assert_eq!(h.condition("widgets", "Stalled").0, "False");
    assert_eq!(
        h.condition("widgets", "Ready"),
        (
            "True".to_owned(),
            "UpToDate".to_owned(),
            "widgets.example.com matches the policy".to_owned()
        )
    );
    let metrics = h.ctx.metrics.encode();
    assert!(
        metrics.contains(r#"crd_lifecycle_policy_state{policy="widgets",state="Ready"} 1"#),
        "{metrics}"
    );
    assert!(!metrics.contains(r#"state="Reconciling""#), "one state at a time");
}

/// The example with 40 objects, one of which does not convert: at the v1alpha1 removal (no
/// preflight), the migration fails.
async fn a_failed_migration() -> Harness {
    let mut h = Harness::with_example_and_objects(40);
    h.fake.set_fault(
        "ns1",
        "w00005",
        ObjectFault::ConversionFails("spec.size must be an integer".into()),
    );
    h.at("2026-06-29T00:00:00Z");
    h.edit_policy("widgets", |p| p["spec"]["migration"]["preflight"] = json!(false));
    h.reconcile("widgets").await;
    wait_until("the migration fails", || migration(&h)["phase"] == "Failed").await;
    h
}

#[tokio::test(start_paused = true)]
async fn a_failed_migration_keeps_the_removal_held() {
    let mut h = a_failed_migration().await;
    let status = migration(&h);
    assert_eq!(status["failed"], 1);
    let failures = status["failures"].as_array().expect("failures");
    assert!(
        failures[0]
            .as_str()
            .unwrap_or_default()
            .starts_with("ns1/w00005: 500"),
        "{failures:?}"
    );
    assert_eq!(h.stored_versions(), json!(["v1alpha1", "v1"]), "not trimmed");

    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:d v1beta1:sd v1:sS", "still held");
    assert_eq!(h.condition("widgets", "Blocked").1, "AwaitingMigration");
    // Not retried at once, and a human must look: Stalled, with the migration's summary.
    let (stalled, reason, message) = h.condition("widgets", "Stalled");
    assert_eq!((stalled.as_str(), reason.as_str()), ("True", "MigrationFailed"));
    assert!(message.contains("1 failed"), "{message}");
    assert_eq!(h.condition("widgets", "Reconciling").0, "False");
    assert!(
        h.fake
            .event_summaries()
            .iter()
            .any(|(t, r, n)| t == "Warning" && r == "MigrationFailed" && n.contains("ns1/w00005"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_controller_resumes_from_the_checkpoint() {
    let mut h = Harness::with_example_and_objects(600);
    h.fake.lock().latency = Duration::from_millis(2);
    h.edit_policy(
        "widgets",
        |p| {
            p["spec"]["migration"] =
                json!({"enabled": true, "concurrency": 2, "pageSize": 50, "preflight": false})
        },
    );
    h.at("2026-02-01T00:00:00Z");
    h.reconcile("widgets").await;
    wait_until("a checkpoint is saved", || {
        let checkpoint = &migration(&h)["checkpoint"];
        checkpoint["continueToken"].is_string() && checkpoint["rewritten"].as_u64().unwrap_or(0) >= 100
    })
    .await;
    // Progress while it runs: in the status (`kubectl get` shows it) and in the gauges.
    let running = migration(&h);
    assert_eq!(running["total"], 600, "{running}");
    let progress = running["progress"].as_str().unwrap_or_default().to_owned();
    let (done, total) = progress.split_once('/').expect("done/total");
    assert!(
        done.parse::<u64>().is_ok_and(|d| d >= 100) && total == "600",
        "{progress}"
    );
    let metrics = h.ctx.metrics.encode();
    let labels = r#"{crd="widgets.example.com",job="migration"}"#;
    assert!(
        metrics.contains(&format!("crd_lifecycle_migration_objects_expected{labels} 600")),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("crd_lifecycle_migration_objects_done{labels} ")));
    assert!(metrics.contains(&format!("crd_lifecycle_migration_objects_per_second{labels} ")));
    // The controller is killed mid-run.
    h.ctx.jobs.shutdown();
    assert!(
        !h.ctx
            .metrics
            .encode()
            .contains("crd_lifecycle_migration_objects_done{"),
        "a stopped run leaves no gauge behind"
    );
    let saved = migration(&h);
    assert_eq!(saved["phase"], "Running");
    let token = saved["checkpoint"]["continueToken"]
        .as_str()
        .expect("token")
        .to_owned();
    assert_eq!(saved["checkpoint"]["storageVersion"], "v1");
    assert_eq!(
        saved["checkpoint"]["crdGeneration"],
        h.fake.crd(CRD)["metadata"]["generation"]
    );
    // (v1 was stored at the first reconcile: v1beta1 never was the storage version.)
    assert_eq!(h.stored_versions(), json!(["v1alpha1", "v1"]));

    // A new controller (new migration manager) picks the run up where it stopped.
    let ctx = &h.ctx;
    let fresh = BackgroundJobs::new(ctx.client.clone(), ctx.recorder.clone(), ctx.metrics.clone(), 2)
        .with_settle_check(super::fast_settle_check());
    h.replace_context(Arc::new(fresh), None);
    h.fake.clear_requests();
    h.reconcile("widgets").await;
    wait_until("the resumed migration succeeds", || {
        migration(&h)["phase"] == "Succeeded"
    })
    .await;
    let first_list = h.fake.metadata_lists().into_iter().next().expect("a list");
    let encoded: String = token.replace(':', "%3A").replace('/', "%2F");
    assert!(
        first_list.query.contains(&format!("continue={encoded}"))
            || first_list.query.contains(&format!("continue={token}")),
        "resumed from {token}: {}",
        first_list.query
    );
    assert_eq!(
        h.fake.encodings(CRD),
        [("v1".to_owned(), 600)].into(),
        "nothing lost"
    );
    // Objects before the checkpoint are counted once, whatever was in flight at the kill.
    let done = migration(&h);
    assert_eq!(done["listed"], 600, "{done}");
    assert_eq!(
        done["rewritten"].as_u64().unwrap_or(0) + done["skipped"].as_u64().unwrap_or(0),
        600,
        "{done}"
    );
    assert_eq!(h.stored_versions(), json!(["v1"]));
    assert!(
        h.fake
            .event_summaries()
            .iter()
            .any(|(_, r, n)| r == "MigrationResumed" && n.starts_with("resuming")),
        "{:?}",
        h.fake.event_summaries()
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_that_could_not_trim_is_repeated_at_once() {
    let mut h = Harness::with_example_and_objects(200);
    // During the first run the CRD's generation changes (as a transition would change it).
    h.fake.after_next_list_page(|state| {
        let mut crd = state.crds[CRD].clone();
        crd["metadata"]["annotations"] = json!({"edited": "yes"});
        crd["spec"]["versions"][1]["deprecationWarning"] = json!("changed by hand");
        state.store_crd(crd, true);
    });
    h.edit_policy("widgets", |p| p["spec"]["migration"]["pageSize"] = json!(50));
    h.at("2026-02-01T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("the repeated run succeeds", || {
        migration(&h)["phase"] == "Succeeded"
    })
    .await;
    let first_pages = h
        .fake
        .metadata_lists()
        .iter()
        .filter(|r| r.path.ends_with("/widgets") && !r.query.contains("continue="))
        .count();
    assert_eq!(first_pages, 2, "two runs: the first could not trim");
    assert_eq!(h.stored_versions(), json!(["v1"]));
    assert_eq!(h.fake.encodings(CRD), [("v1".to_owned(), 200)].into());
}

#[tokio::test(start_paused = true)]
async fn the_migration_after_a_store_waits_for_the_apiserver_to_switch() {
    let mut h = Harness::with_example_and_objects(200);
    // Each CRD change reaches the apiserver answering only 12 requests later (an HA
    // peer that has not seen the update yet).
    h.fake.lock().switch_lag = 12;
    h.at("2026-02-01T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    wait_until("migrated to v1", || h.stored_versions() == json!(["v1"])).await;
    // Every object was really re-encoded: none was rewritten by the lagging apiserver.
    assert_eq!(h.fake.encodings(CRD), [("v1".to_owned(), 200)].into());
    let discovery = h.fake.discovery_requests();
    assert!(
        discovery.len() >= 12,
        "waited through the lag: {}",
        discovery.len()
    );
    wait_until("status written", || migration(&h)["phase"] == "Succeeded").await;
    assert_eq!(migration(&h)["rewritten"], 200);
}

#[tokio::test(start_paused = true)]
async fn the_policy_can_send_rewrites_through_status() {
    let mut h = Harness::with_example_and_objects(50);
    h.fake.edit_crd(CRD, |crd| {
        for version in crd["spec"]["versions"].as_array_mut().expect("versions") {
            version["subresources"] = json!({"status": {}});
        }
    });
    h.edit_policy("widgets", |p| {
        p["spec"]["migration"]["subresource"] = json!("status");
        p["spec"]["migration"]["preflight"] = json!(false);
    });
    h.at("2026-02-01T00:00:00Z");
    h.reconcile("widgets").await;
    wait_until("migrated to v1", || h.stored_versions() == json!(["v1"])).await;
    let rewrites: Vec<_> = h
        .fake
        .object_requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(rewrites.len(), 50);
    assert!(rewrites.iter().all(|r| r.path.ends_with("/status")));
    assert_eq!(h.fake.encodings(CRD), [("v1".to_owned(), 50)].into());
}

#[tokio::test(start_paused = true)]
async fn a_removal_waits_for_the_managed_fields_cleanup_which_resumes_after_a_restart() {
    let mut h = Harness::with_example_and_objects(400);
    // Every object was server-side applied through v1alpha1 (sample 29's entry).
    let keys = h.fake.object_keys(CRD);
    for (ns, name) in &keys {
        h.fake.set_managed_fields(
            CRD,
            ns,
            name,
            vec![json!({
            "apiVersion": "example.com/v1alpha1", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:size": {}}}, "manager": "gitops", "operation": "Apply"})],
        );
    }
    // Only the cleanup runs here: storedVersions is trimmed by hand.
    h.edit_policy(
        "widgets",
        |p| {
            p["spec"]["migration"] =
                json!({"enabled": false, "concurrency": 2, "pageSize": 50, "preflight": false})
        },
    );
    h.fake.lock().latency = Duration::from_millis(2);
    h.at("2026-06-29T00:00:00Z");
    h.reconcile("widgets").await;
    h.trim_stored_versions(&["v1"]);

    // storedVersions is [v1], but objects' managedFields still name v1alpha1: held.
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:d v1beta1:sd v1:sS", "removal held");
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "AwaitingManagedFieldsCleanup")
    );
    assert!(
        message.contains("removal of v1alpha1 waits until no object's metadata.managedFields names it"),
        "{message}"
    );
    let cleanup = |h: &Harness| h.status("widgets")["managedFieldsCleanup"].clone();
    wait_until("a cleanup checkpoint is saved", || {
        cleanup(&h)["checkpoint"]["rewritten"].as_u64().unwrap_or(0) >= 100
    })
    .await;
    assert_eq!(cleanup(&h)["phase"], "Running");
    assert_eq!(cleanup(&h)["versions"], json!(["v1alpha1"]));

    // The controller is killed mid-cleanup; a new one resumes from the checkpoint.
    h.ctx.jobs.shutdown();
    let ctx = &h.ctx;
    let fresh = BackgroundJobs::new(ctx.client.clone(), ctx.recorder.clone(), ctx.metrics.clone(), 2)
        .with_settle_check(super::fast_settle_check());
    h.replace_context(Arc::new(fresh), None);
    h.fake.clear_requests();
    h.reconcile("widgets").await;
    wait_until("the cleanup succeeds", || cleanup(&h)["phase"] == "Succeeded").await;
    let first_list = h.fake.metadata_lists().into_iter().next().expect("a list");
    assert!(
        first_list.query.contains("continue="),
        "resumed: {}",
        first_list.query
    );
    let done = cleanup(&h);
    assert_eq!(done["listed"], 400, "{done}");
    assert_eq!(
        done["rewritten"].as_u64().unwrap_or(0) + done["skipped"].as_u64().unwrap_or(0),
        400,
        "{done}"
    );
    assert!(
        h.fake
            .event_summaries()
            .iter()
            .any(|(_, r, _)| r == "ManagedFieldsCleanupResumed"),
        "{:?}",
        h.fake.event_summaries()
    );

    // Every entry names v1 now; the removal proceeds; server-side apply keeps working.
    for (ns, name) in &keys {
        let entries = h.fake.managed_fields(CRD, ns, name);
        assert_eq!(entries[0]["apiVersion"], "example.com/v1", "{ns}/{name}");
    }
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1beta1:sd v1:sS");
    let api: kube::Api<kube::core::DynamicObject> = kube::Api::namespaced_with(
        h.ctx.client.clone(),
        &keys[0].0,
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("example.com", "v1", "Widget"),
            "widgets",
        ),
    );
    let apply = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": keys[0].1}, "spec": {"size": 7}});
    api.patch(
        &keys[0].1,
        &kube::api::PatchParams::apply("gitops"),
        &kube::api::Patch::Apply(&apply),
    )
    .await
    .expect("server-side apply after the removal");
    let metrics = h.ctx.metrics.encode();
    assert!(
        metrics.contains(
            r#"crd_lifecycle_managed_fields_cleanups_total{crd="widgets.example.com",result="succeeded"} 1"#
        ),
        "{metrics}"
    );
}

/// Found by the simulation (seed 222): an entry naming a version written after its cleanup
/// (an HA apiserver that had not acted on the unserve yet, or a release that dropped a served
/// version after `check --fix` cleaned) makes its object un-appliable for every manager once
/// the version is gone (apiserver-samples/29). After a scheduled version is gone from the
/// CRD, one more cleanup rewrites what names it, and waits until no apiserver serves it.
#[tokio::test(start_paused = true)]
async fn entries_naming_a_version_written_after_its_cleanup_are_cleaned_once_it_is_gone() {
    let mut h = Harness::with_example_and_objects(6);
    h.edit_policy(
        "widgets",
        |p| {
            p["spec"]["migration"] =
                json!({"enabled": false, "concurrency": 2, "pageSize": 50, "preflight": false})
        },
    );
    h.at("2026-06-29T00:00:00Z");
    h.reconcile("widgets").await;
    h.trim_stored_versions(&["v1"]);
    h.reconcile("widgets").await;
    let cleanup = |h: &Harness| h.status("widgets")["managedFieldsCleanup"].clone();
    wait_until("the cleanup before the removal succeeds", || {
        cleanup(&h)["phase"] == "Succeeded"
    })
    .await;
    let cleaned_at = cleanup(&h)["crdGeneration"].clone();
    // After it, a write through an apiserver that still served v1alpha1 left an entry
    // naming it.
    let keys = h.fake.object_keys(CRD);
    let (ns, name) = &keys[2];
    h.fake.set_managed_fields(
        CRD,
        ns,
        name,
        vec![json!({
        "apiVersion": "example.com/v1alpha1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:size": {}}}, "manager": "lagging", "operation": "Update"})],
    );
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1beta1:sd v1:sS", "v1alpha1 removed");
    wait_until("the cleanup after the removal succeeds", || {
        cleanup(&h)["phase"] == "Succeeded" && cleanup(&h)["crdGeneration"] != cleaned_at
    })
    .await;
    assert_eq!(cleanup(&h)["versions"], json!(["v1alpha1"]));
    assert_eq!(
        h.fake.managed_fields(CRD, ns, name)[0]["apiVersion"],
        "example.com/v1",
        "{:#}",
        cleanup(&h)
    );
    assert_eq!(cleanup(&h)["goneVersions"], json!(["v1alpha1"]));
    // Once: the next reconciles start no other cleanup, nor does a later change of the
    // CRD's spec (a new generation: a GitOps tool editing a deprecation warning).
    let done = cleanup(&h);
    h.reconcile("widgets").await;
    h.reconcile("widgets").await;
    assert_eq!(cleanup(&h), done);
    {
        let mut state = h.fake.lock();
        let mut crd = state.crds[CRD].clone();
        crd["spec"]["versions"][0]["deprecationWarning"] = json!("edited by hand");
        state.store_crd(crd, true);
    }
    h.reconcile("widgets").await;
    h.reconcile("widgets").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        cleanup(&h),
        done,
        "cleaned once after v1alpha1 went, not at every generation"
    );
}

#[tokio::test(start_paused = true)]
async fn a_store_starts_one_preflight_even_with_a_stale_cache() {
    use crd_lifecycle::api::VersionPolicy;
    use crd_lifecycle::controller::reconcile;
    use kube::core::DeserializeGuard;
    let mut h = Harness::with_example_and_objects(50);
    h.at("2026-01-05T00:00:00Z");
    // The cache as a reconcile right after the first one may still see it.
    let stale: DeserializeGuard<VersionPolicy> =
        serde_json::from_value(h.fake.policy("widgets")).expect("decodes");
    h.reconcile("widgets").await;
    assert_eq!(h.condition("widgets", "Blocked").1, "AwaitingPreflight");
    wait_until("the preflight passes and its task ends", || {
        h.fake
            .event_summaries()
            .iter()
            .any(|(_, r, _)| r == "PreflightSucceeded")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    reconcile(Arc::new(stale), h.ctx.clone())
        .await
        .expect("reconciles");
    tokio::time::sleep(Duration::from_millis(100)).await;
    // One preflight reads each of the 50 objects through v1beta1 once. (Its events cannot
    // tell: the recorder folds a repeated event into a series.)
    let reads = h
        .fake
        .object_requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.contains("/v1beta1/namespaces/"))
        .count();
    assert_eq!(reads, 50, "one preflight");
}

/// The fixed part of a `MissingPermission` message for a denied `patch widgets`.
const MISSING_PATCH: &str = "missing permission on the objects of widgets.example.com: patch widgets in API group \
example.com. Grant it with a ClusterRole labelled crdlifecycle.io/aggregate-to-migrator=true \
(`crd-lifecycle rbac widgets.example.com` prints it): ";

#[tokio::test(start_paused = true)]
async fn a_missing_grant_blocks_with_the_role_to_add_and_touches_nothing() {
    let mut h = Harness::with_example_and_objects(60);
    h.fake.deny("patch", "example.com", "widgets", "");
    // The store is due (its preflight only reads: allowed), then the migration would start.
    h.at("2026-02-01T00:00:00Z");
    h.reconcile_through_preflight("widgets").await;
    let action = h.reconcile("widgets").await;
    let (blocked, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(
        (blocked.as_str(), reason.as_str()),
        ("True", "MissingPermission"),
        "{message}"
    );
    // Granting changes nothing the controller watches: it checks again soon, backing off
    // to at most 10 s (and a millisecond: requeues round up so that they never wake just
    // before the instant).
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(Duration::from_millis(2_001)),
        "the second check in a row"
    );
    for _ in 0..6 {
        h.reconcile("widgets").await;
    }
    assert_eq!(
        h.reconcile("widgets").await,
        kube::runtime::controller::Action::requeue(Duration::from_millis(10_001)),
        "bounded"
    );
    assert!(message.starts_with(MISSING_PATCH), "{message}");
    assert!(
        message.contains(r#""resources":["widgets"],"verbs":["get","list","patch"]"#),
        "the ClusterRole to add: {message}"
    );
    // A human must grant it: Stalled, and not Ready.
    assert_eq!(h.condition("widgets", "Stalled").1, "MissingPermission");
    assert_eq!(h.condition("widgets", "Ready").1, "MissingPermission");
    assert!(
        h.fake
            .event_summaries()
            .iter()
            .any(|(t, r, n)| t == "Warning" && r == "MissingPermission" && n.starts_with(MISSING_PATCH)),
        "{:?}",
        h.fake.event_summaries()
    );
    // No object was written, and no migration ran.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        h.fake.object_requests().iter().all(|r| r.method == "GET"),
        "only the preflight's reads"
    );
    assert_eq!(h.fake.encodings(CRD), [("v1alpha1".to_owned(), 60)].into());
    assert!(h.status("widgets")["migration"].is_null());
    assert!(
        h.ctx
            .metrics
            .encode()
            .contains(r#"crd_lifecycle_blocked{policy="widgets",reason="MissingPermission"} 1"#)
    );

    // Granted (the labelled ClusterRole added): the next reconcile migrates.
    h.fake.allow_all();
    h.reconcile("widgets").await;
    wait_until("the migration succeeds", || migration(&h)["phase"] == "Succeeded").await;
    assert_eq!(h.fake.encodings(CRD), [("v1".to_owned(), 60)].into());
    h.reconcile("widgets").await;
    assert_ne!(h.condition("widgets", "Blocked").1, "MissingPermission");
}

/// A new leader decides from the policy's status as the old one would: a migration that
/// failed moments ago (`status.migration`: phase and `finishedAt`) is not run again before
/// the wait after a failure is over, and is after it.
#[tokio::test(start_paused = true)]
async fn a_new_leader_waits_after_a_failed_migration_as_the_old_one() {
    let mut h = a_failed_migration().await;
    let writes = |h: &Harness| {
        h.fake
            .object_requests()
            .iter()
            .filter(|r| r.method == "PATCH")
            .count()
    };
    let before = writes(&h);
    h.new_leader();
    h.reconcile("widgets").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(writes(&h), before, "failed moments ago: not run again");
    assert_eq!(migration(&h)["phase"], "Failed");
    // After the wait (100 ms in these tests, by the controller's clock): it runs again.
    h.fake.lock().faults.clear();
    h.at("2026-06-29T00:00:01Z");
    h.reconcile("widgets").await;
    wait_until("the migration succeeds", || migration(&h)["phase"] == "Succeeded").await;
    assert!(writes(&h) > before);
}
