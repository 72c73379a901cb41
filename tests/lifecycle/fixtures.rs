//! Helpers shared by the lifecycle tests.

use crd_lifecycle::api::{VersionPolicy, VersionPolicySpec};
use crd_lifecycle::lifecycle::{self, CrdState, Evaluation, Schedule};
use crd_lifecycle::manifest;
use jiff::Timestamp;

pub const EXAMPLE_POLICY: &str = include_str!("../../examples/widgets/policy.yaml");
pub const EXAMPLE_CRD: &str = include_str!("../../examples/widgets/crd.yaml");

pub fn ts(text: &str) -> Timestamp {
    text.parse().unwrap_or_else(|e| panic!("bad instant {text}: {e}"))
}

pub fn policy(text: &str) -> VersionPolicy {
    manifest::parse_policy(text, "policy.yaml").unwrap_or_else(|e| panic!("{e}"))
}

pub fn crd(text: &str) -> CrdState {
    let (crd, _) = manifest::parse_crd(text, "crd.yaml").unwrap_or_else(|e| panic!("{e}"));
    CrdState::from_crd(&crd)
}

/// The `(path, message)` of every problem the engine finds with `spec` against `crd` at
/// `now`; empty for a valid policy.
pub fn problems(spec: &VersionPolicySpec, crd: &CrdState, now: Timestamp) -> Vec<(String, String)> {
    match Schedule::new(spec, crd, now) {
        Ok(_) => Vec::new(),
        Err(lifecycle::Error::InvalidPolicy(errors)) => errors
            .iter()
            .map(|e| (e.path.clone(), e.message.clone()))
            .collect(),
    }
}

/// A minimal CRD manifest with the given versions as `(name, served, storage)`.
pub fn crd_yaml(versions: &[(&str, bool, bool)]) -> String {
    let mut text = String::from(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\n\
         spec:\n  group: example.com\n  names: {kind: Widget, plural: widgets}\n  scope: Namespaced\n  versions:\n",
    );
    for (name, served, storage) in versions {
        text.push_str(&format!(
            "  - name: {name}\n    served: {served}\n    storage: {storage}\n    \
             schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}\n"
        ));
    }
    text
}

/// A policy manifest for widgets.example.com with the given `spec.versions` YAML
/// (indented as list items under `versions:`).
pub fn policy_yaml(versions: &str) -> String {
    format!(
        "apiVersion: crdlifecycle.io/v1alpha1\nkind: VersionPolicy\nmetadata: {{name: widgets}}\n\
         spec:\n  crdName: widgets.example.com\n  versions:\n{versions}"
    )
}

/// The flags of every present version, compactly: `v1alpha1:sS v1:s` where `s` is served,
/// `S` storage, `d` deprecated and `-` none of them.
pub fn flags(evaluation: &Evaluation) -> String {
    evaluation
        .versions
        .iter()
        .filter(|v| v.present)
        .map(|v| {
            format!(
                "{}:{}",
                v.name,
                crate::flags::letters(v.served, v.storage, v.deprecated)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Validates and evaluates, returning the schedule's error text on failure.
pub fn evaluate(policy: &VersionPolicy, crd: &CrdState, at: Timestamp) -> Result<Evaluation, String> {
    let schedule = Schedule::new(&policy.spec, crd, at).map_err(|e| e.to_string())?;
    Ok(schedule.evaluate(crd, &[], at))
}
