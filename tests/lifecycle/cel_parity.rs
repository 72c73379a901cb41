//! The CRD's CEL rules (`x-kubernetes-validations`, enforced by apiservers 1.25+) and the
//! engine agree on the same inputs. The rules are evaluated client-side by kube's CEL support
//! (kube-cel on cel-rust) against the schema in `crds/versionpolicy.yaml`, the file users
//! install; the engine is what `plan` and the controller run (and all that guards a 1.24
//! apiserver, which ignores CEL).

use kube::core::cel::Validator;
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::fixtures::{crd, crd_yaml, problems};

const INSTALLED_CRD: &str = include_str!("../../crds/versionpolicy.yaml");
const EXAMPLE_POLICY: &str = include_str!("../../examples/widgets/policy.yaml");

fn schema() -> Value {
    let crd: Value = serde_saphyr::from_str(INSTALLED_CRD).expect("the installed CRD parses");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn example() -> Value {
    serde_saphyr::from_str(EXAMPLE_POLICY).expect("the example parses")
}

/// The field paths (without a leading `.`) where a CEL rule fails, with the rule's message.
fn cel_rejections(policy: &Value, old: Option<&Value>) -> Vec<(String, String)> {
    match Validator::new().validate(&schema(), policy, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .iter()
            .map(|e| (e.field_path.trim_start_matches('.').to_owned(), e.message.clone()))
            .collect(),
    }
}

/// The engine's field paths and messages for the policy against the example's CRD.
fn engine_rejections(policy: &Value) -> Vec<(String, String)> {
    let policy: crd_lifecycle::api::VersionPolicy =
        serde_json::from_value(policy.clone()).expect("decodes as a VersionPolicy");
    let crd = crd(&crd_yaml(&[
        ("v1alpha1", true, true),
        ("v1beta1", true, false),
        ("v1", true, false),
    ]));
    problems(&policy.spec, &crd, jiff::Timestamp::MIN)
}

#[test]
fn the_rules_compile_and_the_example_passes_both() {
    let compiled = kube::core::cel::compile_schema(&schema());
    assert!(!compiled.has_errors(), "{:?}", compiled.compilation_errors());
    assert_eq!(cel_rejections(&example(), None), []);
    assert_eq!(engine_rejections(&example()), []);
}

#[test]
fn both_refuse_a_milestone_with_both_or_neither_of_at_and_after() {
    for (milestone, case) in [
        (json!({"at": "2026-03-01T00:00:00Z", "after": "30d"}), "both"),
        (json!({}), "neither"),
    ] {
        let mut policy = example();
        policy["spec"]["versions"][0]["unserve"] = milestone;
        let path = "spec.versions[0].unserve";
        let cel = cel_rejections(&policy, None);
        assert!(
            cel.iter()
                .any(|(p, m)| p == path && m == "exactly one of at or after must be set"),
            "{case}: {cel:?}"
        );
        let engine = engine_rejections(&policy);
        assert!(
            engine
                .iter()
                .any(|(p, m)| p == path && m.starts_with("exactly one of `at` or `after` must be set")),
            "{case}: {engine:?}"
        );
    }
}

#[test]
fn crd_name_is_immutable_on_update_only() {
    let old = example();
    let mut renamed = example();
    renamed["spec"]["crdName"] = json!("gadgets.example.com");
    let cel = cel_rejections(&renamed, Some(&old));
    assert!(
        cel.iter()
            .any(|(p, m)| p == "spec.crdName" && m.contains("immutable")),
        "{cel:?}"
    );
    // A transition rule: a create (no old object) and an unchanged update pass.
    assert_eq!(cel_rejections(&renamed, None), []);
    assert_eq!(cel_rejections(&old, Some(&old)), []);
}

/// Printable, non-empty warnings around the 256-byte limit: ASCII and multi-byte.
fn printable_warning() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{1,300}".prop_filter("not blank", |s| !s.trim().is_empty()),
        "[a-zé❄雪]{1,140}",
        (250usize..262).prop_map(|n| "x".repeat(n)),
        (125usize..131).prop_map(|n| "é".repeat(n)),
    ]
}

proptest! {
    /// The warning's byte limit: CEL's `size(bytes(self)) <= 256` refuses exactly the
    /// warnings whose length the engine refuses, at the same field path.
    #[test]
    fn the_warning_byte_limit_agrees(warning in printable_warning()) {
        let mut policy = example();
        policy["spec"]["versions"][0]["deprecate"]["warning"] = json!(warning);
        let path = "spec.versions[0].deprecate.warning";
        let cel_refuses = cel_rejections(&policy, None)
            .iter()
            .any(|(p, m)| p == path && m == "warning must be at most 256 bytes of UTF-8");
        let engine_refuses = engine_rejections(&policy)
            .iter()
            .any(|(p, m)| p == path && m.contains("bytes long in UTF-8"));
        prop_assert_eq!(cel_refuses, warning.len() > 256, "CEL on {} bytes", warning.len());
        prop_assert_eq!(engine_refuses, cel_refuses, "engine and CEL on {} bytes", warning.len());
    }
}
