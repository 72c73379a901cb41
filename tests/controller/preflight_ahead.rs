//! Conversion preflights that run ahead of their store: the lead they start at, what status
//! says meanwhile, and the result standing until the instant unless the CRD's conversion or
//! objects change.

use super::*;

/// The example's v1beta1 store.
const STORE: &str = "2026-01-05T00:00:00Z";

async fn wait_for_a_passed_preflight(h: &Harness) {
    let fake = h.fake.clone();
    wait_until("the preflight passes", || {
        fake.policy("widgets")["status"]["preflight"]["phase"] == "Succeeded"
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
        h.status("widgets")["preflight"].is_null(),
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
    let preflight = h.status("widgets")["preflight"].clone();
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
    assert!(preflight["conversion"].is_string(), "{preflight}");
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
    assert!(h.status("widgets")["preflight"].is_null());
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
    let digest = h.status("widgets")["preflight"]["objectsDigest"].clone();
    // 10 s (plus the time to list 30 objects) before the instant.
    h.at("2026-01-04T23:59:50Z");
    h.reconcile("widgets").await;
    let fake = h.fake.clone();
    wait_until("the objects are checked", || {
        fake.policy("widgets")["status"]["preflight"]["verifiedAt"] == "2026-01-04T23:59:50Z"
    })
    .await;
    let preflight = h.status("widgets")["preflight"].clone();
    assert_eq!(preflight["phase"], "Succeeded");
    assert_eq!(preflight["objectsDigest"], digest);
    assert_eq!(preflight["startedAt"], "2026-01-04T23:59:00Z", "not read again");
    assert_eq!(event_notes(&h, "PreflightStarted").len(), 1);
    h.at(STORE);
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-", "stored at its instant");
}

/// An object written after the preflight passed: the check before the instant sees it, and
/// the preflight runs again (an Event says why) before the store.
#[tokio::test(start_paused = true)]
async fn objects_changed_since_the_preflight_run_it_again_before_the_store() {
    let mut h = passed_a_minute_ahead().await;
    let digest = h.status("widgets")["preflight"]["objectsDigest"].clone();
    // Someone writes an object.
    h.fake.add_objects(CRD, 1, 4, "v1alpha1");
    h.at("2026-01-04T23:59:50Z");
    h.reconcile("widgets").await;
    let fake = h.fake.clone();
    let before = digest.clone();
    wait_until("the preflight ran again", || {
        let preflight = fake.policy("widgets")["status"]["preflight"].clone();
        preflight["phase"] == "Succeeded" && preflight["objectsDigest"] != before
    })
    .await;
    let repeated = event_notes(&h, "PreflightRepeated");
    assert!(
        repeated
            .iter()
            .any(|n| n.contains("the objects changed since it passed")),
        "{repeated:?}"
    );
    assert_eq!(
        h.status("widgets")["preflight"]["startedAt"],
        "2026-01-04T23:59:50Z"
    );
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
    h.at(STORE);
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:sS v1beta1:s v1:-", "held");
    assert_eq!(h.condition("widgets", "Blocked").1, "AwaitingPreflight");
    h.reconcile_through_preflight("widgets").await;
    assert_eq!(h.status("widgets")["preflight"]["startedAt"], STORE, "read again");
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-");
}

/// The lead grows with the CRD's objects: 5,000 objects at the assumed 50 a second take
/// 100 s to read, so the preflight starts 210 s (twice that, and 10 s) before the store.
#[tokio::test(start_paused = true)]
async fn the_lead_grows_with_the_objects() {
    let mut h = Harness::with_example_and_objects(5000);
    h.at("2026-01-04T23:55:00Z");
    let action = h.reconcile("widgets").await;
    assert!(h.status("widgets")["preflight"].is_null());
    // 23:56:30 is 210 s before the store.
    assert_eq!(action, Action::requeue(Duration::from_millis(90_001)));
}

/// A preflight recorded as running by a controller that stopped mid-way: the next one runs
/// it again rather than waiting for a result that never comes.
#[tokio::test(start_paused = true)]
async fn a_preflight_cut_short_by_a_restart_runs_again() {
    let mut h = Harness::with_example_and_objects(30);
    h.fake
        .lock()
        .policies
        .get_mut("widgets")
        .expect("policy")
        .as_object_mut()
        .expect("object")
        .insert(
            "status".into(),
            json!({"preflight": {"version": "v1beta1", "phase": "Running", "startedAt": "2026-01-04T23:59:00Z"}}),
        );
    h.at(STORE);
    h.reconcile_through_preflight("widgets").await;
    assert_eq!(h.status("widgets")["preflight"]["phase"], "Succeeded");
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:-");
}
