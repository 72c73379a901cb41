//! Conflicts, bad input and everything that must leave the CRD alone.

use std::sync::Arc;

use crd_lifecycle::api::VersionPolicy;
use crd_lifecycle::controller::reconcile;
use kube::core::DeserializeGuard;
use serde_json::json;

use super::{CRD, EXAMPLE_CRD, EXAMPLE_POLICY, Harness, yaml};

#[tokio::test(start_paused = true)]
async fn a_concurrent_edit_makes_the_patch_fail_and_it_is_recomputed() {
    let mut h = Harness::with_example();
    h.at("2026-01-20T00:00:00Z");
    h.reconcile("widgets").await;
    h.fake.clear_requests();
    // Between our read and our patch someone adds a label and a fourth version.
    h.fake.before_next_crd_patch(|state| {
        let mut crd = state.crds[CRD].clone();
        crd["metadata"]["labels"] = json!({"team": "widgets"});
        crd["spec"]["versions"].as_array_mut().expect("versions").insert(
            0,
            json!({"name": "v0", "served": false, "storage": false,
                   "schema": {"openAPIV3Schema": {"type": "object"}}}),
        );
        state.store_crd(crd, true);
    });
    h.at("2026-02-01T00:00:00Z");
    h.reconcile("widgets").await;
    let writes = h.fake.crd_writes();
    assert_eq!(
        writes.len(),
        2,
        "first patch fails its test ops, the second is recomputed"
    );
    // The retry addresses the entries at their new indices.
    assert!(
        writes[1]
            .body
            .to_string()
            .contains(r#""path":"/spec/versions/3/storage""#),
        "{}",
        writes[1].body
    );
    assert_eq!(h.flags(), "v0:- v1alpha1:s v1beta1:s v1:sS");
    assert_eq!(
        h.fake.crd(CRD)["metadata"]["labels"]["team"],
        "widgets",
        "the other edit is kept"
    );
}

#[tokio::test(start_paused = true)]
async fn an_apiserver_rejection_is_reported_not_retried_forever() {
    let mut h = Harness::with_example();
    h.at("2026-01-20T00:00:00Z");
    h.fake
        .fail_next_crd_patch(422, "admission webhook \"crd-guard\" denied the request: frozen");
    h.reconcile("widgets").await;
    assert_eq!(h.fake.crd_writes().len(), 1);
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "UnsafeState"));
    assert!(
        message.contains("the apiserver rejected the change to widgets.example.com: admission webhook"),
        "{message}"
    );
    assert_eq!(h.flags(), "v1alpha1:sS v1beta1:s v1:-", "nothing half-applied");
}

/// Finding 3: a CRD deleted between the read and the patch (a kept copy not forgotten yet,
/// as when it goes during a relist): the patch's 404 is followed by a re-read, which forgets
/// it and says CRDNotFound, instead of an error retried every few seconds.
#[tokio::test(start_paused = true)]
async fn a_crd_deleted_before_the_patch_lands_says_crd_not_found() {
    let mut h = Harness::new();
    h.fake.create_crd(yaml(EXAMPLE_CRD));
    let mut policy = yaml(EXAMPLE_POLICY);
    policy["spec"]["migration"]["enabled"] = json!(false);
    h.add_policy(policy, "2025-11-01T00:00:00Z");
    h.at("2026-01-05T00:00:00Z");
    h.fake.before_next_crd_patch(|state| {
        state.crds.remove("widgets.example.com");
    });
    h.reconcile("widgets").await;
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "CRDNotFound"),
        "{message}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_crd_blocks_until_it_appears() {
    let mut h = Harness::new();
    let mut policy = yaml(EXAMPLE_POLICY);
    policy["spec"]["migration"]["enabled"] = json!(false);
    h.add_policy(policy, "2025-11-01T00:00:00Z");
    h.at("2026-01-20T00:00:00Z");
    h.reconcile("widgets").await;
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "CRDNotFound"));
    assert!(
        message.contains("widgets.example.com does not exist"),
        "{message}"
    );
    assert!(
        h.fake
            .event_summaries()
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "CRDNotFound")
    );
    // Still missing: no new event on every reconcile.
    h.reconcile("widgets").await;
    h.reconcile("widgets").await;
    let event_writes = h
        .fake
        .requests()
        .iter()
        .filter(|r| r.path.contains("/events"))
        .count();
    assert_eq!(event_writes, 1, "one Warning while nothing changes");

    h.fake.create_crd(yaml(EXAMPLE_CRD));
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:s v1beta1:sS v1:s");
    assert_eq!(h.condition("widgets", "Blocked").0, "False");
}

#[tokio::test(start_paused = true)]
async fn an_invalid_policy_is_blocked_and_the_crd_untouched() {
    let mut h = Harness::new();
    h.fake.create_crd(yaml(EXAMPLE_CRD));
    let mut policy = yaml(EXAMPLE_POLICY);
    policy["spec"]["versions"][0]["unserve"] = json!({"after": "90x"});
    policy["spec"]["versions"][1]["unserve"] = json!({"at": "2026-01-10T00:00:00Z"});
    h.add_policy(policy, "2025-11-01T00:00:00Z");
    h.at("2026-03-01T00:00:00Z");
    h.reconcile("widgets").await;
    assert!(h.fake.crd_writes().is_empty(), "no patch");
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "InvalidPolicy"));
    assert!(
        message.contains("spec.versions[0].unserve.after: invalid duration \"90x\""),
        "{message}"
    );
    assert!(message.contains("spec.versions[1].unserve"), "{message}");
    assert_eq!(h.condition("widgets", "Ready").1, "InvalidPolicy");
}

#[tokio::test(start_paused = true)]
async fn a_warning_the_apiserver_would_reject_is_never_sent() {
    // On an apiserver without CEL nothing stops such a policy at admission (sample 22).
    let mut h = Harness::new();
    h.fake.create_crd(yaml(EXAMPLE_CRD));
    let mut policy = yaml(EXAMPLE_POLICY);
    policy["spec"]["versions"][0]["deprecate"]["warning"] = json!("é".repeat(200));
    h.add_policy(policy, "2025-11-01T00:00:00Z");
    h.at("2026-03-01T00:00:00Z");
    h.reconcile("widgets").await;
    assert!(
        h.fake.crd_writes().is_empty(),
        "no patch the apiserver would reject"
    );
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "InvalidPolicy"));
    assert!(
        message.contains("spec.versions[0].deprecate.warning: is 400 bytes long in UTF-8"),
        "{message}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_fake_rejects_warnings_as_the_apiserver_does() {
    let h = Harness::with_example();
    let client = h.ctx.client.clone();
    let crds: kube::Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = kube::Api::all(client);
    for (warning, message) in [
        ("é".repeat(200), "must be <= 256 characters long"),
        (String::new(), "must not be an empty string"),
        (
            "use\u{a0}v1".to_owned(),
            "non-printable character found at index 3",
        ),
    ] {
        let patch = json!([{"op": "add", "path": "/spec/versions/0/deprecated", "value": true},
                           {"op": "add", "path": "/spec/versions/0/deprecationWarning", "value": warning}]);
        let error = crds
            .patch(
                CRD,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::<()>::Json(serde_json::from_value(patch).expect("patch")),
            )
            .await
            .expect_err("rejected");
        let kube::Error::Api(status) = error else {
            panic!("{error}")
        };
        assert_eq!(status.code, 422);
        assert!(
            status
                .message
                .contains("spec.versions[0].deprecationWarning: Invalid value"),
            "{}",
            status.message
        );
        assert!(status.message.contains(message), "{}", status.message);
    }
}

#[tokio::test(start_paused = true)]
async fn an_undecodable_policy_is_reported_invalid() {
    let mut h = Harness::new();
    let mut policy = yaml(EXAMPLE_POLICY);
    policy["spec"]["migration"]["concurrency"] = json!("lots");
    h.add_policy(policy.clone(), "2025-11-01T00:00:00Z");
    let object: DeserializeGuard<VersionPolicy> =
        serde_json::from_value(h.fake.policy("widgets")).expect("guard");
    assert!(object.0.is_err());
    reconcile(Arc::new(object), h.ctx.clone())
        .await
        .expect("reported, not failed");
    let (status, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "InvalidPolicy"));
    assert!(message.contains("cannot be read"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn the_older_of_two_policies_keeps_the_crd() {
    let mut h = Harness::with_example();
    let mut rival = yaml(EXAMPLE_POLICY);
    rival["metadata"]["name"] = json!("widgets-rival");
    rival["spec"]["versions"] = json!([{"name": "v1alpha1", "deprecate": {"at": "2026-01-01T00:00:00Z"}}]);
    h.add_policy(rival, "2025-11-02T00:00:00Z");
    h.at("2026-01-20T00:00:00Z");
    h.reconcile("widgets-rival").await;
    assert!(h.fake.crd_writes().is_empty());
    let (status, reason, message) = h.condition("widgets-rival", "Blocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Conflict"));
    assert!(
        message.contains("VersionPolicy widgets already governs widgets.example.com"),
        "{message}"
    );

    h.reconcile("widgets").await;
    assert_eq!(
        h.flags(),
        "v1alpha1:s v1beta1:sS v1:s",
        "the older policy applies"
    );

    // Once the older one is deleted, the other takes over.
    h.fake.lock().policies.remove("widgets");
    h.reconcile("widgets-rival").await;
    assert_eq!(h.condition("widgets-rival", "Blocked").0, "False");
}

#[tokio::test(start_paused = true)]
async fn suspend_changes_nothing() {
    let mut h = Harness::with_example();
    h.edit_policy("widgets", |p| p["spec"]["suspend"] = json!(true));
    h.at("2026-03-01T00:00:00Z");
    h.reconcile("widgets").await;
    assert!(h.fake.crd_writes().is_empty());
    assert_eq!(h.condition("widgets", "Blocked").1, "Suspended");
    assert_eq!(h.condition("widgets", "Ready").0, "False");
    assert_eq!(h.status("widgets")["observedGeneration"], 2);

    h.edit_policy("widgets", |p| p["spec"]["suspend"] = json!(false));
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:sd v1beta1:s v1:sS");
}

#[tokio::test(start_paused = true)]
async fn dry_run_reports_the_patch_without_applying_it() {
    let mut h = Harness::with_example();
    h.edit_policy("widgets", |p| p["spec"]["dryRun"] = json!(true));
    h.at("2026-01-15T00:00:00Z");
    h.reconcile("widgets").await;
    assert!(h.fake.crd_writes().is_empty());
    assert_eq!(h.flags(), "v1alpha1:sS v1beta1:s v1:-");
    let patch: serde_json::Value =
        serde_json::from_str(h.status("widgets")["dryRunPatch"].as_str().expect("dryRunPatch"))
            .expect("JSON");
    let ops = patch.as_array().expect("ops");
    assert!(
        ops.contains(&json!({"op": "replace", "path": "/spec/versions/2/served", "value": true})),
        "{patch}"
    );
    assert!(
        ops.contains(&json!({"op": "replace", "path": "/spec/versions/1/storage", "value": true})),
        "{patch}"
    );
    assert_eq!(h.condition("widgets", "Ready").1, "DryRun");
    assert!(h.fake.event_summaries().iter().any(|(_, r, _)| r == "DryRun"));
    // The status shows the CRD as it is.
    assert_eq!(h.status("widgets")["storageVersion"], "v1alpha1");
}

#[tokio::test(start_paused = true)]
async fn drift_is_corrected_and_reported() {
    let mut h = Harness::with_example();
    h.at("2026-03-15T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:sd v1beta1:s v1:sS");
    // A Helm upgrade re-applies the original CRD manifest.
    h.fake.edit_crd(CRD, |crd| {
        let original = yaml(EXAMPLE_CRD);
        crd["spec"]["versions"] = original["spec"]["versions"].clone();
    });
    assert_eq!(h.flags(), "v1alpha1:sS v1beta1:s v1:-");
    h.reconcile("widgets").await;
    assert_eq!(h.flags(), "v1alpha1:sd v1beta1:s v1:sS");
    let events = h.fake.event_summaries();
    let drift = events
        .iter()
        .find(|(_, r, _)| r == "DriftCorrected")
        .expect("DriftCorrected event");
    assert_eq!(drift.0, "Warning");
    assert!(drift.2.contains("v1 store"), "{drift:?}");
    // Drift is not a new transition: history keeps one entry per milestone.
    let history = h.status("widgets")["history"].as_array().expect("history").len();
    // (v1beta1's store was superseded by v1's before the first reconcile: never applied.)
    assert_eq!(history, 3);
}

#[tokio::test(start_paused = true)]
async fn deleting_a_policy_leaves_the_crd_as_it_is() {
    let mut h = Harness::with_example();
    h.at("2026-03-15T00:00:00Z");
    h.reconcile("widgets").await;
    let before = h.fake.crd(CRD);
    h.fake.clear_requests();
    h.edit_policy("widgets", |p| {
        p["metadata"]["deletionTimestamp"] = json!("2026-03-15T00:00:00Z")
    });
    h.at("2026-06-01T00:00:00Z");
    h.reconcile("widgets").await;
    assert!(h.fake.crd_writes().is_empty());
    assert_eq!(h.fake.crd(CRD), before);
}

#[tokio::test(start_paused = true)]
async fn history_only_grows_whatever_the_cache() {
    let mut h = Harness::with_example();
    h.at("2026-01-15T00:00:00Z");
    // The cache as it was before the next transition's status write.
    let stale: DeserializeGuard<VersionPolicy> =
        serde_json::from_value(h.fake.policy("widgets")).expect("decodes");
    h.reconcile("widgets").await;
    h.at("2026-02-01T00:00:00Z");
    h.reconcile("widgets").await;
    let recorded = h.status("widgets")["history"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!recorded.is_empty(), "transitions were recorded");

    // A reconcile that sees the stale cache (e.g. right after our own CRD patch) keeps them.
    reconcile(Arc::new(stale), h.ctx.clone())
        .await
        .expect("reconciles");
    let after = h.status("widgets")["history"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for entry in &recorded {
        assert!(after.contains(entry), "{entry} kept: {after:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_deleted_policy_that_does_not_decode_is_let_go() {
    let mut h = Harness::new();
    let mut policy = yaml(EXAMPLE_POLICY);
    policy["spec"]["migration"]["concurrency"] = json!("lots");
    policy["metadata"]["finalizers"] = json!([crd_lifecycle::controller::RELEASE_FINALIZER]);
    h.add_policy(policy, "2025-11-01T00:00:00Z");
    h.fake.delete_policy("widgets");
    let object: DeserializeGuard<VersionPolicy> =
        serde_json::from_value(h.fake.policy("widgets")).expect("guard");
    assert!(object.0.is_err());
    reconcile(Arc::new(object), h.ctx.clone())
        .await
        .expect("let go, not failed");
    assert!(
        h.fake.policy("widgets").is_null(),
        "its finalizer removed, the policy gone"
    );
}
