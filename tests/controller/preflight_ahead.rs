//! Conversion preflights that run ahead of their store: the lead they start at, what status
//! says meanwhile, and the result standing until the instant unless the CRD's conversion or
//! objects change.

use super::*;

/// The example's v1beta1 store.
const STORE: &str = "2026-01-05T00:00:00Z";

async fn wait_for_a_passed_preflight(h: &Harness) {
    let fake = h.fake.clone();
    wait_until("the preflight passes", || {
        preflight_of(&fake, "widgets", "v1beta1")["phase"] == "Succeeded"
    })
    .await;
}

/// The example with 30 objects, its v1beta1 preflight passed a minute before the store.
async fn passed_a_minute_ahead() -> Harness {
    let mut h = Harness::with_example_and_objects(30);
    h.at("2026-01-04T23:59:00Z");
    h.reconcile("widgets").await;
    wait_for_a_passed_preflight(&h).await;
    h
}

/// At the v1beta1 store's instant `at`: the store waits (`AwaitingPreflight`) for a
/// preflight that runs then, and lands once it passed.
async fn the_store_waits_for_a_preflight_of_its_own(h: &mut Harness, at: &str) {
    h.at(at);
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:sS v1beta1:s v1:-", "held");
    assert_eq!(h.condition("widgets", "Blocked").1, "AwaitingPreflight");
    h.reconcile_through_preflight("widgets").await;
    assert_eq!(h.preflight("widgets", "v1beta1")["startedAt"], at, "read again");
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-");
}

fn event_notes(h: &Harness, reason: &str) -> Vec<String> {
    h.fake
        .events()
        .iter()
        .filter(|e| e["reason"] == reason)
        .map(|e| {
            e["note"]
                .as_str()
                .or(e["message"].as_str())
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// The lead derived for a small CRD is the minimum, a minute: nothing is read before it,
/// the controller wakes for it, and status and an Event name the store it runs ahead of.
#[tokio::test(start_paused = true)]
async fn a_preflight_starts_at_its_lead_and_names_the_store_it_runs_ahead_of() {
    let mut h = Harness::with_example_and_objects(30);
    h.at("2026-01-04T23:58:59Z");
    let action = h.reconcile("widgets").await;
    assert!(
        h.preflight("widgets", "v1beta1").is_null(),
        "{}",
        h.status("widgets")
    );
    assert_eq!(
        action,
        Action::requeue(Duration::from_millis(1_001)),
        "wakes at the lead"
    );
    h.at("2026-01-04T23:59:00Z");
    h.reconcile("widgets").await;
    wait_for_a_passed_preflight(&h).await;
    let preflight = h.preflight("widgets", "v1beta1").clone();
    assert_eq!(preflight["version"], "v1beta1");
    assert_eq!(preflight["storeAt"], STORE);
    assert_eq!(preflight["startedAt"], "2026-01-04T23:59:00Z");
    assert_eq!(preflight["read"], 30);
    assert!(
        preflight["objectsDigest"]
            .as_str()
            .is_some_and(|d| d.starts_with("30-")),
        "{preflight}"
    );
    assert!(preflight["fingerprint"].is_string(), "{preflight}");
    let started = event_notes(&h, "PreflightStarted");
    assert!(
        started
            .iter()
            .any(|n| n.contains("ahead of the v1beta1 store at 2026-01-05T00:00:00Z")),
        "{started:?}"
    );
    assert_eq!(
        h.flags(),
        "v1alpha1:sS v1beta1:s v1:-",
        "nothing switched before the instant"
    );
}

/// `spec.migration.preflightLead` sets the lead; an invalid one names its field.
#[tokio::test(start_paused = true)]
async fn a_configured_lead_starts_the_preflight_that_long_before_the_store() {
    let mut h = Harness::with_example_and_objects(30);
    h.edit_policy("widgets", |p| {
        p["spec"]["migration"]["preflightLead"] = json!("10m")
    });
    h.at("2026-01-04T23:49:59Z");
    let action = h.reconcile("widgets").await;
    assert!(h.preflight("widgets", "v1beta1").is_null());
    assert_eq!(action, Action::requeue(Duration::from_millis(1_001)));
    h.at("2026-01-04T23:50:00Z");
    h.reconcile("widgets").await;
    wait_for_a_passed_preflight(&h).await;

    h.edit_policy("widgets", |p| {
        p["spec"]["migration"]["preflightLead"] = json!("ten minutes")
    });
    h.reconcile("widgets").await;
    let (_, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(reason, "InvalidPolicy");
    assert!(message.contains("spec.migration.preflightLead"), "{message}");
}

/// A passed preflight stands until its store's instant: shortly before it, the objects are
/// listed again (names and resourceVersions), found unchanged, and the store lands on its
/// instant without reading them again.
#[tokio::test(start_paused = true)]
async fn a_passed_preflight_stands_until_the_instant_while_the_objects_are_unchanged() {
    let mut h = passed_a_minute_ahead().await;
    let digest = h.preflight("widgets", "v1beta1")["objectsDigest"].clone();
    // 10 s (plus the time to list 30 objects) before the instant.
    h.at("2026-01-04T23:59:50Z");
    h.reconcile("widgets").await;
    let fake = h.fake.clone();
    wait_until("the objects are checked", || {
        preflight_of(&fake, "widgets", "v1beta1")["verifiedAt"] == "2026-01-04T23:59:50Z"
    })
    .await;
    let preflight = h.preflight("widgets", "v1beta1").clone();
    assert_eq!(preflight["phase"], "Succeeded");
    assert_eq!(preflight["objectsDigest"], digest);
    assert_eq!(preflight["startedAt"], "2026-01-04T23:59:00Z", "not read again");
    assert_eq!(event_notes(&h, "PreflightStarted").len(), 1);
    h.at(STORE);
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-", "stored at its instant");
}

/// Finding 11: objects written after the preflight passed (a controller writing their
/// status: only their resourceVersions move). The check before the instant lists the objects
/// and reads, converts and checks only those three again; the store lands on its instant.
#[tokio::test(start_paused = true)]
async fn a_status_write_on_a_few_objects_rechecks_only_those_and_the_store_lands_on_time() {
    let mut h = passed_a_minute_ahead().await;
    let digest = h.preflight("widgets", "v1beta1")["objectsDigest"].clone();
    assert_eq!(
        h.object_reads("v1beta1"),
        30,
        "the preflight read each object once"
    );
    // Another controller writes the status of three objects.
    h.fake.add_objects(CRD, 3, 4, "v1alpha1");
    h.at("2026-01-04T23:59:50Z");
    h.reconcile("widgets").await;
    let fake = h.fake.clone();
    wait_until("the objects are checked again", || {
        preflight_of(&fake, "widgets", "v1beta1")["verifiedAt"] == "2026-01-04T23:59:50Z"
    })
    .await;
    assert_eq!(
        h.object_reads("v1beta1"),
        33,
        "only the three written since read again"
    );
    let preflight = h.preflight("widgets", "v1beta1");
    assert_eq!(preflight["phase"], "Succeeded");
    assert_ne!(preflight["objectsDigest"], digest, "the objects as they are now");
    assert_eq!(preflight["startedAt"], "2026-01-04T23:59:00Z", "no new preflight");
    assert_eq!(event_notes(&h, "PreflightStarted").len(), 1);
    let verified = event_notes(&h, "PreflightVerified");
    assert!(
        verified
            .iter()
            .any(|n| n.contains("3 of 30 created or changed since were read through v1beta1 and fit")),
        "{verified:?}"
    );
    h.at(STORE);
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-", "stored at its instant");
}

/// A controller that did not run the preflight (a new leader) does not know which objects
/// it read: it compares their digest, and when they changed it reads every object again,
/// saying why; the store waits for it rather than passing.
#[tokio::test(start_paused = true)]
async fn a_new_leader_reads_every_object_again_when_they_changed() {
    let mut h = passed_a_minute_ahead().await;
    let digest = h.preflight("widgets", "v1beta1")["objectsDigest"].clone();
    h.new_leader();
    h.fake.add_objects(CRD, 1, 4, "v1alpha1");
    h.at("2026-01-04T23:59:50Z");
    h.reconcile("widgets").await;
    let fake = h.fake.clone();
    let before = digest.clone();
    wait_until("the preflight ran again", || {
        let preflight = preflight_of(&fake, "widgets", "v1beta1");
        preflight["phase"] == "Succeeded" && preflight["objectsDigest"] != before
    })
    .await;
    let repeated = event_notes(&h, "PreflightRepeated");
    assert!(
        repeated.iter().any(|n| n.contains(
            "the objects changed since it passed, and this controller (started since) does not know which"
        )),
        "{repeated:?}"
    );
    assert_eq!(
        h.preflight("widgets", "v1beta1")["startedAt"],
        "2026-01-04T23:59:50Z"
    );
    assert_eq!(h.object_reads("v1beta1"), 60, "every object read again");
    h.at(STORE);
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-");
}

/// A result read through another conversion than the CRD's now does not stand: at the
/// instant the store waits (`AwaitingPreflight`) for the preflight to run again.
#[tokio::test(start_paused = true)]
async fn a_preflight_read_through_another_conversion_does_not_stand() {
    let mut h = passed_a_minute_ahead().await;
    h.fake
        .edit_crd(CRD, |crd| crd["spec"]["conversion"] = json!({"strategy": "None"}));
    the_store_waits_for_a_preflight_of_its_own(&mut h, STORE).await;
}

/// The lead grows with the CRD's objects: 5,000 objects at the assumed 50 a second take
/// 100 s to read, so the preflight starts 210 s (twice that, and 10 s) before the store.
#[tokio::test(start_paused = true)]
async fn the_lead_grows_with_the_objects() {
    let mut h = Harness::with_example_and_objects(5000);
    h.at("2026-01-04T23:55:00Z");
    let action = h.reconcile("widgets").await;
    assert!(h.preflight("widgets", "v1beta1").is_null());
    // 23:56:30 is 210 s before the store.
    assert_eq!(action, Action::requeue(Duration::from_millis(90_001)));
}

/// A preflight recorded as running by a controller that stopped mid-way: the next one runs
/// it again rather than waiting for a result that never comes.
#[tokio::test(start_paused = true)]
async fn a_preflight_cut_short_by_a_restart_runs_again() {
    let mut h = Harness::with_example_and_objects(30);
    let fingerprint = fingerprint_of(&h, "v1beta1");
    h.apply_status_as(
        "crd-lifecycle-preflight-v1beta1",
        json!({"preflights": [{"version": "v1beta1", "phase": "Running", "startedAt": "2026-01-04T23:59:00Z",
            "storeAt": STORE, "fingerprint": fingerprint}]}),
    )
    .await;
    h.at(STORE);
    h.reconcile_through_preflight("widgets").await;
    assert_eq!(h.preflight("widgets", "v1beta1")["phase"], "Succeeded");
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-");
}

/// What a preflight through `version` of the harness' CRD checks against, as it is now.
fn fingerprint_of(h: &Harness, version: &str) -> String {
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(h.fake.crd(CRD)).expect("CRD");
    crd_lifecycle::controller::jobs::preflight::fingerprints(&crd)[version].clone()
}

/// Finding 5: the check before the instant was missed (the controller was down from a
/// minute before the store until hours after it). The result that passed then does not
/// stand: the store waits (`AwaitingPreflight`) while the objects are checked (the new
/// controller compares their digest: unchanged), then lands, with no new preflight.
#[tokio::test(start_paused = true)]
async fn a_store_at_its_instant_with_an_unverified_result_waits_for_the_check() {
    let mut h = passed_a_minute_ahead().await;
    h.new_leader();
    h.at("2026-01-05T03:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:sS v1beta1:s v1:-", "held");
    let (_, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(reason, "AwaitingPreflight");
    assert!(
        message.contains("checked again: they were last checked at 2026-01-04T23:59:00Z"),
        "{message}"
    );
    let fake = h.fake.clone();
    wait_until("the objects are checked", || {
        preflight_of(&fake, "widgets", "v1beta1")["verifiedAt"] == "2026-01-05T03:00:00Z"
    })
    .await;
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-", "stored after the check");
    assert_eq!(event_notes(&h, "PreflightStarted").len(), 1, "no new preflight");
    assert_eq!(h.object_reads("v1beta1"), 30, "no object read again");
}

/// Finding 5: a configured lead says when the preflight starts, not how long the check
/// before the instant takes: with 5,000 objects it starts 15 s (10 s and a second per 1,000
/// objects) before the instant, as with a derived lead.
#[tokio::test(start_paused = true)]
async fn a_configured_lead_gets_a_check_sized_for_the_objects() {
    let mut h = Harness::with_example_and_objects(5000);
    h.edit_policy("widgets", |p| {
        p["spec"]["migration"]["preflightLead"] = json!("10m")
    });
    h.at("2026-01-04T23:50:00Z");
    h.reconcile("widgets").await;
    wait_for_a_passed_preflight(&h).await;
    h.at("2026-01-04T23:59:00Z");
    let action = h.reconcile("widgets").await;
    // 23:59:45 is 15 s before the store.
    assert_eq!(action, Action::requeue(Duration::from_millis(45_001)));
}

/// Finding 5: a result from an earlier store of the same version (the store moved since it
/// passed) does not stand for the store as it is now: that store waits for its own.
#[tokio::test(start_paused = true)]
async fn a_result_for_an_earlier_store_of_the_version_does_not_stand() {
    let mut h = passed_a_minute_ahead().await;
    h.edit_policy("widgets", |p| {
        p["spec"]["versions"][1]["store"] = json!({"at": "2026-01-05T00:10:00Z"})
    });
    the_store_waits_for_a_preflight_of_its_own(&mut h, "2026-01-05T00:10:00Z").await;
    assert_eq!(
        h.preflight("widgets", "v1beta1")["storeAt"],
        "2026-01-05T00:10:00Z"
    );
}

/// Finding 5: the objects are checked against the schema of the version they are read
/// through; a change of that schema (the conversion the same) makes the result stale.
#[tokio::test(start_paused = true)]
async fn a_change_of_the_target_schema_makes_the_result_stale() {
    let mut h = passed_a_minute_ahead().await;
    h.fake.edit_crd(CRD, |crd| {
        let v1beta1 = crd["spec"]["versions"]
            .as_array_mut()
            .and_then(|vs| vs.iter_mut().find(|v| v["name"] == "v1beta1"))
            .expect("v1beta1");
        v1beta1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["color"] =
            json!({"type": "string", "maxLength": 16});
    });
    the_store_waits_for_a_preflight_of_its_own(&mut h, STORE).await;
}

/// Finding 6: two stores whose preflights run ahead at once (v1beta1 at 00:00, v1 30 s
/// later) keep a result each, and neither runs again.
#[tokio::test(start_paused = true)]
async fn two_stores_running_ahead_at_once_keep_both_results() {
    let mut h = Harness::with_example_and_objects(30);
    h.edit_policy("widgets", |p| {
        p["spec"]["versions"][2] = json!({"name": "v1", "introduce": {"at": "2026-01-01T00:00:00Z"},
            "store": {"at": "2026-01-05T00:00:30Z"}});
    });
    h.at("2026-01-01T00:00:00Z");
    h.reconcile("widgets").await;
    assert!(h.flags().contains("v1:s"), "v1 served: {}", h.flags());
    h.at("2026-01-04T23:59:30Z");
    h.reconcile("widgets").await;
    let fake = h.fake.clone();
    wait_until("both preflights pass", || {
        ["v1beta1", "v1"]
            .iter()
            .all(|v| preflight_of(&fake, "widgets", v)["phase"] == "Succeeded")
    })
    .await;
    // Later reconciles (past any "moments ago"), before either check is due.
    tokio::time::sleep(Duration::from_secs(120)).await;
    h.at("2026-01-04T23:59:40Z");
    h.reconcile("widgets").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.reconcile("widgets").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for version in ["v1beta1", "v1"] {
        let preflight = h.preflight("widgets", version);
        assert_eq!(preflight["phase"], "Succeeded", "{version}: {preflight}");
        assert_eq!(
            preflight["startedAt"], "2026-01-04T23:59:30Z",
            "{version}: {preflight}"
        );
    }
    assert_eq!(event_notes(&h, "PreflightStarted").len(), 2, "one each");
    assert_eq!(h.object_reads("v1beta1") + h.object_reads("v1"), 60);
}

/// A new leader with the same cluster state decides as the old one: it does not run again
/// a preflight that passed within its lead ...
#[tokio::test(start_paused = true)]
async fn a_new_leader_does_not_run_again_a_preflight_that_passed() {
    let mut h = passed_a_minute_ahead().await;
    h.new_leader();
    h.at("2026-01-04T23:59:20Z");
    h.reconcile("widgets").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        event_notes(&h, "PreflightStarted").len(),
        1,
        "passed: not run again"
    );
    assert_eq!(h.object_reads("v1beta1"), 30);
}

/// ... nor one that failed within the wait after a failure (read from the result's
/// `finishedAt`, not remembered by the controller that ran it); after the wait it does.
#[tokio::test(start_paused = true)]
async fn a_new_leader_waits_after_a_failed_preflight_as_the_old_one() {
    let mut h = Harness::with_example_and_objects(30);
    h.fake.set_fault(
        "ns1",
        "w00001",
        crate::apiserver::ObjectFault::ConversionFails("spec.size must be an integer".into()),
    );
    h.at(STORE);
    h.reconcile_through_preflight("widgets").await;
    assert_eq!(h.preflight("widgets", "v1beta1")["phase"], "Failed");
    let reads = h.object_reads("v1beta1");
    h.new_leader();
    h.reconcile("widgets").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    h.reconcile("widgets").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        h.object_reads("v1beta1"),
        reads,
        "failed moments ago: not run again"
    );
    assert_eq!(h.condition("widgets", "Blocked").1, "ConversionPreflightFailed");
    // After the wait (100 ms in these tests), it runs again.
    h.fake.lock().faults.clear();
    h.at("2026-01-05T00:00:01Z");
    h.reconcile("widgets").await;
    let fake = h.fake.clone();
    wait_until("the preflight passes", || {
        preflight_of(&fake, "widgets", "v1beta1")["phase"] == "Succeeded"
    })
    .await;
    assert_eq!(h.object_reads("v1beta1"), reads + 30, "every object read again");
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-");
}

/// An upgrade: the single `status.preflight` an earlier release wrote for this store is read
/// for its version, but it does not say which schema the objects were checked against, so
/// the preflight runs again, knowingly (the Event says why), and the old field is cleared.
#[tokio::test(start_paused = true)]
async fn a_result_of_an_earlier_release_runs_again_knowingly() {
    let mut h = Harness::with_example_and_objects(30);
    h.apply_status_as(
        "crd-lifecycle-preflight",
        json!({"preflight": {"version": "v1beta1", "phase": "Succeeded", "startedAt": "2026-01-04T23:59:00Z",
            "finishedAt": "2026-01-04T23:59:00Z", "storeAt": STORE, "read": 30, "objectsDigest": "30-0",
            "conversion": "0", "failed": 0}}),
    )
    .await;
    assert_eq!(h.preflight("widgets", "v1beta1")["phase"], "Succeeded", "read");
    h.at(STORE);
    h.reconcile("widgets").await;
    assert_eq!(h.condition("widgets", "Blocked").1, "AwaitingPreflight");
    h.reconcile_through_preflight("widgets").await;
    let started = event_notes(&h, "PreflightStarted");
    assert!(
        started[0].contains("recorded by an earlier release of crd-lifecycle"),
        "{started:?}"
    );
    let status = h.status("widgets");
    assert!(status["preflight"].is_null(), "cleared: {status}");
    assert_eq!(h.preflight("widgets", "v1beta1")["startedAt"], STORE);
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-");
}
