//! `crd-lifecycle adopt`: a VersionPolicy for a live CRD that changes nothing when applied:
//! every version's current state written as milestones already reached, with commented
//! suggestions for the next steps under the Kubernetes deprecation policy (pure). A CRD
//! whose `status.storedVersions` lists versions besides the storage version gets the
//! migration off, saying what turning it on would do: rewrite every object and trim.

use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// What `adopt` prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adopted {
    /// The policy as YAML, with comments.
    pub policy: String,
    /// What to tell the person on stderr: why the migration is off, and what turning it on
    /// would do.
    pub note: Option<String>,
}

/// The policy for the live CRD. Milestones that are reached are dated at the CRD's creation
/// (or `now` without one): every one is in the past, none is in the future. `objects` is how
/// many objects the CRD has, where known (said in the note about a stale `storedVersions`).
pub fn adopt(
    crd: &CustomResourceDefinition,
    policy_name: &str,
    now: Timestamp,
    objects: Option<u64>,
) -> Adopted {
    let crd_name = crd.metadata.name.clone().unwrap_or_default();
    let reached = crd
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0)
        .round(jiff::Unit::Second)
        .unwrap_or(now);
    let at = format!("\"{reached}\"");
    let stored: Vec<String> = crd
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.clone())
        .unwrap_or_default();
    let storage = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone());
    let mut out = format!(
        "# Adopted from the live CRD {crd_name} on {now}: every milestone below is already\n\
         # reached (dated at the CRD's creation), so applying this policy changes nothing.\n\
         # Check with `crd-lifecycle plan --policy THIS_FILE --crd <(kubectl get crd {crd_name} -o yaml)`.\n\
         apiVersion: crdlifecycle.io/v1alpha1\n\
         kind: VersionPolicy\n\
         metadata:\n  name: {policy_name}\n\
         spec:\n  crdName: {crd_name}\n  versions:\n"
    );
    // A migration would rewrite every object and trim storedVersions at once.
    let stale: Vec<&String> = stored.iter().filter(|v| Some(*v) != storage.as_ref()).collect();
    let mut left_out = Vec::new();
    for version in &crd.spec.versions {
        let deprecated = version.deprecated.unwrap_or(false);
        if !version.served && !deprecated {
            // `unserve` needs an earlier `deprecate`, which would change the flag.
            left_out.push(version.name.clone());
            continue;
        }
        out.push_str(&format!("  - name: {}\n", version.name));
        if version.storage {
            out.push_str(&format!("    store: {{at: {at}}}\n"));
        }
        if deprecated {
            match &version.deprecation_warning {
                Some(warning) => out.push_str(&format!(
                    "    deprecate: {{at: {at}, warning: {}}}\n",
                    serde_json::to_string(warning).unwrap_or_default()
                )),
                None => out.push_str(&format!("    deprecate: {{at: {at}}}\n")),
            }
        }
        if !version.served {
            out.push_str(&format!("    unserve: {{at: {at}}}\n"));
        }
        for line in suggestions(
            &version.name,
            version.served,
            deprecated,
            version.storage,
            &stored,
            storage.as_deref(),
        ) {
            out.push_str(&format!("    # next: {line}\n"));
        }
    }
    let note = match (stale.is_empty(), storage.as_deref()) {
        (true, _) => {
            out.push_str("  migration: {enabled: true}\n");
            None
        }
        (false, storage) => {
            let storage = storage.unwrap_or("the storage version");
            let objects = objects.map_or_else(|| "every object".to_owned(), |n| format!("{n} objects"));
            let stale_list = stale.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(", ");
            let effect = format!(
                "the controller would rewrite {objects} into {storage} and trim status.storedVersions from [{}] to [{storage}]",
                stored.join(", ")
            );
            for line in [
                format!("The migration is off: status.storedVersions lists {stale_list} besides the storage"),
                format!("version {storage}, so with `migration: {{enabled: true}}` {effect}."),
                format!("Turn it on (or run `crd-lifecycle migrate {crd_name}`) when you want that; until"),
                format!(
                    "then objects may still be stored in {stale_list}, and removing {} stays blocked.",
                    if stale.len() == 1 { "it" } else { "them" }
                ),
            ] {
                out.push_str(&format!("  # {line}\n"));
            }
            out.push_str("  migration: {enabled: false}\n");
            Some(format!(
                "{crd_name}: status.storedVersions lists {stale_list} besides the storage version {storage}. \
                 The policy printed has `migration: {{enabled: false}}`, so applying it changes nothing; \
                 with the migration on, {effect}."
            ))
        }
    };
    for name in left_out {
        out.push_str(&format!(
            "# {name} is neither served nor deprecated: it is left out (its flags stay as they are).\n\
             # To serve it later, add it with `introduce: {{at: ...}}`.\n"
        ));
    }
    Adopted { policy: out, note }
}

/// The next steps for a version, under the Kubernetes API deprecation policy (alpha: any
/// time; beta: 9 months or 3 releases after deprecation; GA: 12 months or 3 releases).
fn suggestions(
    name: &str,
    served: bool,
    deprecated: bool,
    storage: bool,
    stored: &[String],
    storage_version: Option<&str>,
) -> Vec<String> {
    let stage_wait = if name.contains("alpha") {
        ("an alpha version may go at any time", "30d")
    } else if name.contains("beta") {
        (
            "a deprecated beta may be unserved 9 months (or 3 releases) after its deprecation",
            "270d",
        )
    } else {
        (
            "a deprecated GA version may be unserved 12 months (or 3 releases) after its deprecation",
            "365d",
        )
    };
    let mut next = Vec::new();
    if served && deprecated {
        next.push(format!(
            "{}: `unserve: {{after: {}}}`",
            stage_wait.0, stage_wait.1
        ));
    }
    if served && !deprecated && !storage {
        next.push(format!(
            "once clients have moved to {}: `deprecate: {{at: ..., warning: \"...\"}}`",
            storage_version.unwrap_or("the storage version")
        ));
    }
    if !served {
        let waits = if stored.iter().any(|v| v == name) {
            "once a migration trims it from status.storedVersions (turn `migration` on, below) and after the managedFields cleanup"
        } else {
            "after the managedFields cleanup"
        };
        next.push(format!("remove it {waits}: `remove: {{after: 30d}}`"));
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reached_milestones_and_suggestions() {
        let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "widgets.example.com", "creationTimestamp": "2025-06-01T10:00:00Z"},
            "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"}, "scope": "Namespaced",
                     "versions": [
                        {"name": "v1alpha1", "served": false, "storage": false, "deprecated": true},
                        {"name": "v1beta1", "served": true, "storage": false, "deprecated": true, "deprecationWarning": "use v1"},
                        {"name": "v1", "served": true, "storage": true},
                        {"name": "v2", "served": false, "storage": false}]},
            "status": {"storedVersions": ["v1"]}
        }))
        .expect("crd");
        let adopted = adopt(
            &crd,
            "widgets",
            "2026-11-23T00:00:00Z".parse().expect("now"),
            Some(4),
        );
        assert_eq!(adopted.note, None, "storedVersions is clean");
        let text = adopted.policy;
        assert!(text.ends_with("  migration: {enabled: true}\n# v2 is neither served nor deprecated: it is left out (its flags stay as they are).\n# To serve it later, add it with `introduce: {at: ...}`.\n"), "{text}");
        assert!(text.contains("  - name: v1alpha1\n    deprecate: {at: \"2025-06-01T10:00:00Z\"}\n    unserve: {at: \"2025-06-01T10:00:00Z\"}\n"), "{text}");
        assert!(text.contains("    deprecate: {at: \"2025-06-01T10:00:00Z\", warning: \"use v1\"}\n    # next: a deprecated beta may be unserved 9 months"), "{text}");
        assert!(
            text.contains("  - name: v1\n    store: {at: \"2025-06-01T10:00:00Z\"}\n"),
            "{text}"
        );
        assert!(
            text.contains("# v2 is neither served nor deprecated: it is left out"),
            "{text}"
        );
        assert!(!text.contains("name: v2"), "{text}");
    }
}
