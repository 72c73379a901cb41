//! Every milestone applied at its instant, with the exact patches, status and events.

use std::time::Duration;

use kube::runtime::controller::Action;
use serde_json::json;

use super::{CRD, Harness};

#[tokio::test(start_paused = true)]
async fn every_milestone_is_applied_at_its_instant() {
    let mut h = Harness::with_example();
    let steps = [
        ("2026-01-04T23:59:59Z", "v1alpha1:sS v1beta1:s v1:-", None),
        (
            "2026-01-05T00:00:00Z",
            "v1alpha1:s v1beta1:sS v1:-",
            Some("StorageVersionChanged"),
        ),
        (
            "2026-01-15T00:00:00Z",
            "v1alpha1:s v1beta1:sS v1:s",
            Some("VersionIntroduced"),
        ),
        (
            "2026-02-01T00:00:00Z",
            "v1alpha1:s v1beta1:s v1:sS",
            Some("StorageVersionChanged"),
        ),
        (
            "2026-03-01T00:00:00Z",
            "v1alpha1:sd v1beta1:s v1:sS",
            Some("VersionDeprecated"),
        ),
        (
            "2026-04-01T00:00:00Z",
            "v1alpha1:sd v1beta1:sd v1:sS",
            Some("VersionDeprecated"),
        ),
        (
            "2026-05-30T00:00:00Z",
            "v1alpha1:d v1beta1:sd v1:sS",
            Some("VersionUnserved"),
        ),
    ];
    for (instant, flags, event) in steps {
        h.at(instant);
        let events_before = h.fake.events().len();
        h.reconcile("widgets").await;
        assert_eq!(
            h.flags(),
            flags,
            "at {instant}: {:#}",
            h.status("widgets")["conditions"]
        );
        let events = h.fake.event_summaries();
        if let Some(reason) = event {
            assert!(
                events[events_before..]
                    .iter()
                    .any(|(t, r, _)| t == "Normal" && r == reason),
                "{reason} at {instant}: {events:?}"
            );
        }
        // A second reconcile at the same instant changes nothing.
        h.fake.clear_requests();
        h.reconcile("widgets").await;
        assert!(h.fake.crd_writes().is_empty(), "no second patch at {instant}");
    }
    assert_eq!(h.stored_versions(), json!(["v1alpha1", "v1beta1", "v1"]));

    // v1alpha1's removal is due but it is still in storedVersions: held.
    h.at("2026-06-29T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:d v1beta1:sd v1:sS");
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "AwaitingMigration"));
    assert!(message.contains("removal of v1alpha1 is held"), "{message}");
    // With migrations off, only a human can migrate: kstatus reads Stalled.
    assert_eq!(
        h.condition("widgets", "Stalled").0.as_str(),
        "True",
        "{:#}",
        h.status("widgets")
    );
    assert_eq!(h.condition("widgets", "Stalled").1, "AwaitingMigration");
    assert_eq!(h.condition("widgets", "Reconciling").0, "False");
    assert!(
        h.fake
            .event_summaries()
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "AwaitingMigration")
    );

    // The migrator trims storedVersions: the block lifts and, once no object's
    // managedFields names v1alpha1, the removal proceeds.
    h.trim_stored_versions(&["v1"]);
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(h.flags(), "v1beta1:sd v1:sS");
    assert_eq!(h.condition("widgets", "Blocked").0, "False");
    assert!(
        h.fake
            .event_summaries()
            .iter()
            .any(|(_, r, n)| r == "VersionRemoved" && n.contains("v1alpha1"))
    );

    h.at("2026-07-30T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1beta1:d v1:sS");
    h.at("2026-08-29T00:00:00Z");
    h.reconcile_through_cleanup("widgets").await;
    assert_eq!(
        h.flags(),
        "v1:sS",
        "v1beta1 removed (it left storedVersions with the trim)"
    );

    let status = h.status("widgets");
    let history: Vec<String> = status["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["version"].as_str().unwrap_or_default(),
                e["milestone"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        history,
        [
            "v1beta1 store",
            "v1 introduce",
            "v1 store",
            "v1alpha1 deprecate",
            "v1beta1 deprecate",
            "v1alpha1 unserve",
            "v1alpha1 remove",
            "v1beta1 unserve",
            "v1beta1 remove"
        ]
    );
    let phases: Vec<String> = status["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .map(|v| {
            format!(
                "{}={}",
                v["name"].as_str().unwrap_or_default(),
                v["phase"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(phases, ["v1=Stored", "v1alpha1=Removed", "v1beta1=Removed"]);
    assert_eq!(
        h.condition("widgets", "Ready").0,
        "True",
        "{:?} {:#}",
        h.condition("widgets", "Ready"),
        h.fake.crd(CRD)
    );
    assert!(status.get("nextTransition").is_none(), "nothing left to do");
}

#[tokio::test(start_paused = true)]
async fn the_store_patch_is_guarded_and_minimal() {
    let mut h = Harness::with_example();
    h.at("2026-01-20T00:00:00Z");
    h.reconcile("widgets").await;
    h.fake.clear_requests();
    let resource_version = h.fake.crd(CRD)["metadata"]["resourceVersion"].clone();

    h.at("2026-02-01T00:00:00Z");
    h.reconcile("widgets").await;
    let writes = h.fake.crd_writes();
    assert_eq!(writes.len(), 1, "one patch per reconcile");
    assert_eq!(writes[0].method, "PATCH");
    assert_eq!(writes[0].content_type, "application/json-patch+json");
    assert_eq!(
        writes[0].body,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "test", "path": "/spec/versions/1/name", "value": "v1beta1"},
            {"op": "test", "path": "/spec/versions/2/name", "value": "v1"},
            {"op": "replace", "path": "/spec/versions/1/storage", "value": false},
            {"op": "replace", "path": "/spec/versions/2/storage", "value": true},
        ])
    );
}

#[tokio::test(start_paused = true)]
async fn deprecation_and_removal_patches() {
    let mut h = Harness::with_example();
    h.at("2026-02-15T00:00:00Z");
    h.reconcile("widgets").await;
    let rv = h.fake.crd(CRD)["metadata"]["resourceVersion"].clone();
    h.fake.clear_requests();
    h.at("2026-03-01T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(
        h.fake.crd_writes()[0].body,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "test", "path": "/spec/versions/0/name", "value": "v1alpha1"},
            {"op": "add", "path": "/spec/versions/0/deprecated", "value": true},
            {"op": "add", "path": "/spec/versions/0/deprecationWarning",
             "value": "example.com/v1alpha1 Widget is deprecated; use example.com/v1"},
        ])
    );

    h.at("2026-06-01T00:00:00Z");
    h.reconcile("widgets").await;
    h.trim_stored_versions(&["v1"]);
    // v1alpha1 was unserved at 05-30: its managedFields cleanup runs (and ends) well before
    // its removal is due.
    let fake = h.fake.clone();
    super::wait_until("v1alpha1's managedFields cleanup ends", || {
        fake.policy("widgets")["status"]["managedFieldsCleanup"]["phase"] == "Succeeded"
    })
    .await;
    let rv = h.fake.crd(CRD)["metadata"]["resourceVersion"].clone();
    h.fake.clear_requests();
    h.at("2026-08-29T00:00:00Z");
    h.reconcile("widgets").await;
    // v1alpha1 goes on time; v1beta1 is unserved first, and its removal waits for the
    // cleanup that starts now.
    assert_eq!(
        h.fake.crd_writes()[0].body,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "test", "path": "/spec/versions/0/name", "value": "v1alpha1"},
            {"op": "test", "path": "/spec/versions/1/name", "value": "v1beta1"},
            {"op": "replace", "path": "/spec/versions/1/served", "value": false},
            {"op": "remove", "path": "/spec/versions/0"},
        ])
    );
    assert_eq!(
        h.condition("widgets", "Blocked").1,
        "AwaitingManagedFieldsCleanup"
    );
    let rv = h.fake.crd(CRD)["metadata"]["resourceVersion"].clone();
    h.fake.clear_requests();
    h.reconcile_through_cleanup("widgets").await;
    let removal = h
        .fake
        .crd_writes()
        .into_iter()
        .find(|w| {
            w.body
                .as_array()
                .is_some_and(|ops| ops.iter().any(|op| op["op"] == "remove"))
        })
        .expect("the removal patch");
    assert_eq!(
        removal.body,
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "test", "path": "/spec/versions/0/name", "value": "v1beta1"},
            {"op": "remove", "path": "/spec/versions/0"},
        ])
    );
    assert_eq!(h.flags(), "v1:sS");
}

#[tokio::test(start_paused = true)]
async fn requeues_at_the_next_transition() {
    let mut h = Harness::with_example();
    h.at("2026-01-04T23:59:58Z");
    assert_eq!(
        h.reconcile("widgets").await,
        Action::requeue(Duration::from_millis(2001))
    );
    h.at("2026-01-05T00:00:00Z");
    // The next one is ten days away: the resync caps the wait.
    assert_eq!(
        h.reconcile("widgets").await,
        Action::requeue(Duration::from_secs(600))
    );
    let next = &h.status("widgets")["nextTransition"];
    assert_eq!(next["version"], "v1");
    assert_eq!(next["milestone"], "introduce");
    assert_eq!(next["at"], "2026-01-15T00:00:00Z");
    assert_eq!(next["summary"], "v1 introduce 2026-01-15T00:00:00Z");
}

#[tokio::test(start_paused = true)]
async fn status_reports_versions_conditions_and_generation() {
    let mut h = Harness::with_example();
    h.at("2026-03-15T00:00:00Z");
    h.reconcile("widgets").await;
    let status = h.status("widgets");
    assert_eq!(status["observedGeneration"], 1);
    assert_eq!(status["storageVersion"], "v1");
    let versions = status["versions"].as_array().expect("versions");
    assert_eq!(versions[0]["name"], "v1alpha1");
    assert_eq!(versions[0]["phase"], "Deprecated");
    assert_eq!(versions[0]["deprecated"], true);
    assert_eq!(versions[2]["phase"], "Stored");
    assert!(versions[2]["lastTransitionTime"].is_string());
    assert_eq!(h.condition("widgets", "Ready").0, "True");
    assert_eq!(h.condition("widgets", "Blocked").1, "NotBlocked");
    // Migrations are pending for the old storage versions, but off in this policy: the
    // operator is idle (Ready), and says what is left to do.
    let (reconciling, reason, message) = h.condition("widgets", "Reconciling");
    assert_eq!(
        (reconciling.as_str(), reason.as_str()),
        ("False", "MigrationPending")
    );
    assert!(
        message.contains("crd-lifecycle migrate widgets.example.com"),
        "{message}"
    );
    assert!(
        message.contains("objects stored in v1alpha1 must be rewritten into v1"),
        "{message}"
    );

    // The same situation a minute later yields an identical status.
    h.at("2026-03-15T00:01:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.status("widgets"), status);
}
