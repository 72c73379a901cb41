//! The `decide` step on plain data: no fake apiserver, no client.

use crd_lifecycle::api::{MilestoneKind, VersionPolicy};
use crd_lifecycle::controller::decide::{WebhookConversion, decide};
use crd_lifecycle::lifecycle::GateInputs;
use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::json;

use super::{EXAMPLE_CRD, EXAMPLE_POLICY};

fn policy(edit: impl FnOnce(&mut serde_json::Value)) -> VersionPolicy {
    let mut value = super::yaml(EXAMPLE_POLICY);
    edit(&mut value);
    serde_json::from_value(value).expect("policy")
}

fn crd(edit: impl FnOnce(&mut serde_json::Value)) -> CustomResourceDefinition {
    let mut value = super::yaml(EXAMPLE_CRD);
    value["metadata"]["resourceVersion"] = json!("7");
    edit(&mut value);
    serde_json::from_value(value).expect("CRD")
}

fn at(text: &str) -> Timestamp {
    text.parse().expect("instant")
}

fn reasons(blocked: &[(crd_lifecycle::controller::conditions::ConditionReason, String)]) -> Vec<&str> {
    blocked.iter().map(|(r, _)| r.as_str()).collect()
}

#[test]
fn a_due_store_waits_for_its_preflight() {
    let decision = decide(
        &policy(|_| {}),
        &crd(|_| {}),
        &GateInputs::default(),
        &WebhookConversion::NotWanted,
        at("2026-01-05T00:00:00Z"),
        None,
    );
    assert_eq!(reasons(&decision.blocked), ["AwaitingPreflight"]);
    assert!(decision.ops.is_empty(), "{:?}", decision.ops);
    assert!(decision.pending.is_empty());
}

#[test]
fn a_due_store_is_one_guarded_patch() {
    let policy = policy(|p| p["spec"]["migration"]["preflight"] = json!(false));
    let decision = decide(
        &policy,
        &crd(|_| {}),
        &GateInputs::default(),
        &WebhookConversion::NotWanted,
        at("2026-01-05T00:00:00Z"),
        None,
    );
    assert!(decision.blocked.is_empty(), "{:?}", decision.blocked);
    assert_eq!(
        decision.ops[0],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
    );
    assert!(
        decision
            .ops
            .iter()
            .any(|op| op == &json!({"op": "replace", "path": "/spec/versions/1/storage", "value": true}))
    );
    let pending: Vec<_> = decision
        .pending
        .iter()
        .map(|t| (t.version.as_str(), t.milestone))
        .collect();
    assert_eq!(pending, [("v1beta1", MilestoneKind::Store)]);
}

#[test]
fn an_invalid_policy_decides_nothing() {
    let policy = policy(|p| p["spec"]["versions"][0]["unserve"] = json!({"after": "90x"}));
    let decision = decide(
        &policy,
        &crd(|_| {}),
        &GateInputs::default(),
        &WebhookConversion::NotWanted,
        at("2026-03-01T00:00:00Z"),
        None,
    );
    assert_eq!(reasons(&decision.blocked), ["InvalidPolicy"]);
    assert!(decision.evaluation.is_none() && decision.ops.is_empty());
}

#[test]
fn a_type_change_that_does_not_compile_is_an_invalid_policy() {
    let policy = policy(|p| {
        p["spec"]["conversion"] = json!({"changes": [
            {"from": "v1alpha1", "to": "v1beta1"},
            {"from": "v1beta1", "to": "v1",
             "changed": [{"path": "spec.port", "upgrade": "int(self)", "downgrade": "string(other)"}]},
        ]})
    });
    let decision = decide(
        &policy,
        &crd(|_| {}),
        &GateInputs::default(),
        &WebhookConversion::NotWanted,
        at("2026-03-01T00:00:00Z"),
        None,
    );
    assert_eq!(reasons(&decision.blocked), ["InvalidPolicy"]);
    let (_, message) = &decision.blocked[0];
    assert!(
        message.contains(
            "spec.conversion.changes[1].changed[0].downgrade: unknown name other: only self is available"
        ),
        "{message}"
    );
    assert!(decision.ops.is_empty(), "nothing is applied");
}

#[test]
fn a_wanted_webhook_without_one_is_reported() {
    let policy = policy(|p| p["spec"]["conversion"] = json!({"webhook": {"enabled": true}}));
    let decision = decide(
        &policy,
        &crd(|_| {}),
        &GateInputs::default(),
        &WebhookConversion::NoWebhook,
        at("2025-12-01T00:00:00Z"),
        None,
    );
    assert_eq!(reasons(&decision.blocked), ["WebhookNotConfigured"]);
    let decision = decide(
        &policy,
        &crd(|_| {}),
        &GateInputs::default(),
        &WebhookConversion::Desired(json!({"strategy": "Webhook"})),
        at("2025-12-01T00:00:00Z"),
        None,
    );
    assert!(decision.conversion_changed);
    assert!(decision.ops.iter().any(|op| op["path"] == "/spec/conversion"));
}

#[test]
fn a_removal_waits_for_the_managed_fields_cleanup() {
    // v1alpha1 unserved, nothing stored in it any more; no cleanup recorded yet.
    let crd = crd(|c| {
        c["spec"]["versions"][0]["served"] = json!(false);
        c["spec"]["versions"][0]["deprecated"] = json!(true);
        c["spec"]["versions"][1]["deprecated"] = json!(true);
        c["spec"]["versions"][1]["deprecationWarning"] =
            json!("example.com/v1beta1 Widget is deprecated; use example.com/v1");
        c["spec"]["versions"][0]["deprecationWarning"] =
            json!("example.com/v1alpha1 Widget is deprecated; use example.com/v1");
        c["spec"]["versions"][0]["storage"] = json!(false);
        c["spec"]["versions"][2]["storage"] = json!(true);
        c["spec"]["versions"][2]["served"] = json!(true);
        c["status"] = json!({"storedVersions": ["v1"]});
        c["metadata"]["generation"] = json!(3);
    });
    let held = decide(
        &policy(|_| {}),
        &crd,
        &GateInputs::default(),
        &WebhookConversion::NotWanted,
        at("2026-06-29T00:00:00Z"),
        None,
    );
    assert_eq!(
        reasons(&held.blocked),
        ["AwaitingManagedFieldsCleanup"],
        "{:?}",
        held.blocked
    );
    assert!(!held.ops.iter().any(|op| op["op"] == "remove"));
    // A cleanup that succeeded at an earlier generation of the CRD does not count: any spec
    // change since may have served v1alpha1 again (found by the simulation: a GitOps tool
    // re-applied the older CRD, a client applied through v1alpha1, the controller unserved
    // it again and removed it under the new entry).
    let earlier = policy(|p| {
        p["status"] = json!({"managedFieldsCleanup": {"phase": "Succeeded", "storageVersion": "v1", "versions": ["v1alpha1"], "crdGeneration": 2}});
    });
    let still_held = decide(
        &earlier,
        &crd,
        &GateInputs::default(),
        &WebhookConversion::NotWanted,
        at("2026-06-29T00:00:00Z"),
        None,
    );
    assert_eq!(reasons(&still_held.blocked), ["AwaitingManagedFieldsCleanup"]);
    // Once a cleanup of v1alpha1 succeeded at this generation, the removal is in the patch.
    let cleaned = policy(|p| {
        p["status"] = json!({"managedFieldsCleanup": {"phase": "Succeeded", "storageVersion": "v1", "versions": ["v1alpha1"], "crdGeneration": 3}});
    });
    let removal = decide(
        &cleaned,
        &crd,
        &GateInputs::default(),
        &WebhookConversion::NotWanted,
        at("2026-06-29T00:00:00Z"),
        None,
    );
    assert!(removal.blocked.is_empty(), "{:?}", removal.blocked);
    assert!(
        removal
            .ops
            .iter()
            .any(|op| op == &json!({"op": "remove", "path": "/spec/versions/0"})),
        "{:?}",
        removal.ops
    );
}

#[test]
fn removals_are_one_patch_highest_index_first() {
    let crd = crd(|c| {
        for (i, served) in [(0, false), (1, false), (2, true)] {
            c["spec"]["versions"][i]["served"] = json!(served);
            c["spec"]["versions"][i]["storage"] = json!(i == 2);
        }
        c["spec"]["versions"][0]["deprecated"] = json!(true);
        c["spec"]["versions"][0]["deprecationWarning"] =
            json!("example.com/v1alpha1 Widget is deprecated; use example.com/v1");
        c["spec"]["versions"][1]["deprecated"] = json!(true);
        c["spec"]["versions"][1]["deprecationWarning"] =
            json!("example.com/v1beta1 Widget is deprecated; use example.com/v1");
        c["status"] = json!({"storedVersions": ["v1"]});
        c["metadata"]["generation"] = json!(5);
    });
    let cleaned = policy(|p| {
        p["status"] = json!({"managedFieldsCleanup": {"phase": "Succeeded", "storageVersion": "v1", "versions": ["v1alpha1", "v1beta1"], "crdGeneration": 5}});
    });
    let decision = decide(
        &cleaned,
        &crd,
        &GateInputs::default(),
        &WebhookConversion::NotWanted,
        at("2026-08-29T00:00:00Z"),
        None,
    );
    assert!(decision.blocked.is_empty(), "{:?}", decision.blocked);
    assert_eq!(
        decision.ops,
        [
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"}),
            json!({"op": "test", "path": "/spec/versions/0/name", "value": "v1alpha1"}),
            json!({"op": "test", "path": "/spec/versions/1/name", "value": "v1beta1"}),
            json!({"op": "remove", "path": "/spec/versions/1"}),
            json!({"op": "remove", "path": "/spec/versions/0"}),
        ]
    );
}

#[test]
fn a_conversion_that_leaves_a_field_of_the_live_crd_uncovered_is_an_invalid_policy() {
    // The live CRD's v1 has no spec.color, which v1beta1 has: without a rule the apiserver
    // would prune it from every object converted to v1.
    let without_color = |c: &mut serde_json::Value| {
        let fields =
            c["spec"]["versions"][2]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                .as_object_mut()
                .expect("v1's spec fields");
        fields.remove("color");
    };
    let uncovered = policy(|p| {
        p["spec"]["conversion"] = json!({"webhook": {"enabled": true}, "changes": [
            {"from": "v1alpha1", "to": "v1beta1"},
            {"from": "v1beta1", "to": "v1"},
        ]})
    });
    let decision = decide(
        &uncovered,
        &crd(without_color),
        &GateInputs::default(),
        &WebhookConversion::NotWanted,
        at("2026-03-01T00:00:00Z"),
        None,
    );
    assert_eq!(reasons(&decision.blocked), ["InvalidPolicy"]);
    let (_, message) = &decision.blocked[0];
    assert!(
        message.contains(
            "spec.conversion.changes[1]: v1beta1 -> v1: spec.color (string) of v1beta1 has no place in v1"
        ),
        "{message}"
    );
    assert!(
        decision.ops.is_empty(),
        "the CRD is not pointed at the webhook, nothing is applied"
    );
    // Saying where it goes (or that it is dropped on purpose) makes the policy valid.
    let covered = policy(|p| {
        p["spec"]["conversion"] = json!({"webhook": {"enabled": true}, "changes": [
            {"from": "v1alpha1", "to": "v1beta1"},
            {"from": "v1beta1", "to": "v1", "removed": ["spec.color"]},
        ]})
    });
    let decision = decide(
        &covered,
        &crd(without_color),
        &GateInputs::default(),
        &WebhookConversion::NotWanted,
        at("2026-03-01T00:00:00Z"),
        None,
    );
    assert!(
        !reasons(&decision.blocked).contains(&"InvalidPolicy"),
        "{:?}",
        decision.blocked
    );
}

/// Finding 5 on plain data: at a store's instant a passed preflight stands only if it ran
/// for that store, against what the CRD has now (conversion and the version's schema), and
/// its objects were checked shortly before; otherwise the store waits for the check.
#[test]
fn a_passed_preflight_stands_at_the_instant_only_if_checked_just_before() {
    use crd_lifecycle::controller::gates;
    use crd_lifecycle::controller::jobs::preflight;
    let crd = crd(|_| {});
    let fingerprint = preflight::fingerprints(&crd)["v1beta1"].clone();
    let decide_with = |edit: &dyn Fn(&mut serde_json::Value), now: &str| {
        let mut entry = json!({"version": "v1beta1", "phase": "Succeeded",
            "startedAt": "2026-01-04T23:58:00Z", "finishedAt": "2026-01-04T23:59:00Z",
            "storeAt": "2026-01-05T00:00:00Z", "read": 30, "objectsDigest": "30-00ff",
            "fingerprint": fingerprint});
        edit(&mut entry);
        let policy = policy(|p| p["status"] = json!({"preflights": [entry]}));
        let status = policy.status.clone().unwrap_or_default();
        let gates = GateInputs {
            preflight: gates::preflight_results(&status, &crd),
            ..GateInputs::default()
        };
        let decision = decide(
            &policy,
            &crd,
            &gates,
            &WebhookConversion::NotWanted,
            at(now),
            None,
        );
        reasons(&decision.blocked).join(",")
    };
    let store = "2026-01-05T00:00:00Z";
    // Passed a minute ahead, never checked since (the check before the instant missed).
    assert_eq!(decide_with(&|_| {}, store), "AwaitingPreflight");
    // Checked 10 s before the instant: it lands; and 10 s late still.
    let checked = |e: &mut serde_json::Value| e["verifiedAt"] = json!("2026-01-04T23:59:50Z");
    assert_eq!(decide_with(&checked, store), "");
    assert_eq!(decide_with(&checked, "2026-01-05T00:00:10Z"), "");
    // Hours late (a controller down over the instant): not on that check.
    assert_eq!(decide_with(&checked, "2026-01-05T03:00:00Z"), "AwaitingPreflight");
    // For another store of the version, or against another schema or conversion: no.
    let other_store = |e: &mut serde_json::Value| {
        checked(e);
        e["storeAt"] = json!("2025-12-01T00:00:00Z");
    };
    assert_eq!(decide_with(&other_store, store), "AwaitingPreflight");
    let other_schema = |e: &mut serde_json::Value| {
        checked(e);
        e["fingerprint"] = json!("0000000000000000");
    };
    assert_eq!(decide_with(&other_schema, store), "AwaitingPreflight");
    // Failed: held, saying so.
    let failed = |e: &mut serde_json::Value| e["phase"] = json!("Failed");
    assert_eq!(decide_with(&failed, store), "ConversionPreflightFailed");
}
