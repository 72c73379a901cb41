//! What an audit finds in one CRD, from plain data: its versions, `storedVersions`, the
//! governing policy, and its objects' `metadata.managedFields` entries (pure).

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use serde::Serialize;

/// One version of the CRD as it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionFlags {
    pub name: String,
    pub served: bool,
    pub storage: bool,
    pub deprecated: bool,
}

/// One managedFields entry of one object: its manager, the version it wrote through and
/// when (apiserver-samples/29 shows their shape).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub manager: String,
    /// The version of its `apiVersion` (`example.com/v1alpha1` → `v1alpha1`).
    pub version: String,
    pub time: Option<Timestamp>,
}

/// What an audit collected of one CRD.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub name: String,
    pub group: String,
    pub versions: Vec<VersionFlags>,
    pub stored_versions: Vec<String>,
    pub governed_by: Option<String>,
    pub objects: u64,
    /// Every object's entries, one list per object.
    pub entries: Vec<Vec<Entry>>,
    /// Why the objects could not be listed (their problems are then unknown).
    pub list_error: Option<String>,
}

/// One problem of a CRD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// `StaleStoredVersions`, `ManagedFieldsNameUnservedVersion`, `WriterOnDeprecatedVersion`,
    /// or `ObjectsNotListed`.
    pub kind: &'static str,
    pub version: String,
    /// How many objects it concerns (0 where it is not about objects).
    pub objects: u64,
    /// The field managers it concerns; for `WriterOnDeprecatedVersion`, `manager (time)`.
    pub managers: Vec<String>,
    pub message: String,
}

/// The audit of one CRD.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdAudit {
    pub name: String,
    pub storage_version: Option<String>,
    pub stored_versions: Vec<String>,
    pub versions: Vec<VersionFlags>,
    /// Objects of the CRD.
    pub objects: u64,
    /// The VersionPolicy governing it, if one does.
    pub governed_by: Option<String>,
    pub problems: Vec<Problem>,
}

/// Finds the problems of one CRD.
pub fn audit(collected: &Collected) -> CrdAudit {
    let storage = collected
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone());
    let served: BTreeSet<&str> = collected
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.as_str())
        .collect();
    let deprecated: BTreeSet<&str> = collected
        .versions
        .iter()
        .filter(|v| v.deprecated && v.served)
        .map(|v| v.name.as_str())
        .collect();
    let mut problems = Vec::new();
    for version in &collected.stored_versions {
        if Some(version) != storage.as_ref() {
            problems.push(Problem {
                kind: "StaleStoredVersions",
                version: version.clone(),
                objects: 0,
                managers: Vec::new(),
                message: format!(
                    "status.storedVersions lists {version} besides the storage version {}: objects may still be stored in it, and removing it is blocked until a migration trims the list (`crd-lifecycle migrate {}`)",
                    storage.as_deref().unwrap_or("(none)"),
                    collected.name
                ),
            });
        }
    }
    if let Some(error) = &collected.list_error {
        problems.push(Problem {
            kind: "ObjectsNotListed",
            version: storage.clone().unwrap_or_default(),
            objects: 0,
            managers: Vec::new(),
            message: format!(
                "the objects could not be listed, so their managedFields were not checked: {error}"
            ),
        });
    }
    // Entries naming versions that are not served (or gone from the CRD).
    let mut unserved: BTreeMap<String, (u64, BTreeSet<String>)> = BTreeMap::new();
    // The latest write of each manager through each deprecated version.
    let mut latest: BTreeMap<(String, String), Option<Timestamp>> = BTreeMap::new();
    // The latest write of each manager, whatever the version.
    let mut newest: BTreeMap<String, (Option<Timestamp>, String)> = BTreeMap::new();
    for entries in &collected.entries {
        let mut counted: BTreeSet<&str> = BTreeSet::new();
        for entry in entries {
            if !served.contains(entry.version.as_str()) {
                let slot = unserved.entry(entry.version.clone()).or_default();
                if counted.insert(entry.version.as_str()) {
                    slot.0 += 1;
                }
                slot.1.insert(entry.manager.clone());
            }
            let best = newest
                .entry(entry.manager.clone())
                .or_insert((None, String::new()));
            if entry.time >= best.0 {
                *best = (entry.time, entry.version.clone());
            }
            if deprecated.contains(entry.version.as_str()) {
                let at = latest
                    .entry((entry.version.clone(), entry.manager.clone()))
                    .or_default();
                *at = (*at).max(entry.time);
            }
        }
    }
    for (version, (objects, managers)) in unserved {
        let in_crd = collected.versions.iter().any(|v| v.name == version);
        problems.push(Problem {
            kind: "ManagedFieldsNameUnservedVersion",
            version: version.clone(),
            objects,
            managers: managers.iter().cloned().collect(),
            message: format!(
                "{objects} objects have managedFields entries naming {version}, which is {}: server-side apply by {} breaks once it is removed (`crd-lifecycle repair-managed-fields {}` rewrites them)",
                if in_crd { "not served" } else { "not in the CRD" },
                managers.iter().cloned().collect::<Vec<_>>().join(", "),
                collected.name
            ),
        });
    }
    // Writers whose latest write went through a deprecated version.
    let mut writers: BTreeMap<String, Vec<(String, Option<Timestamp>)>> = BTreeMap::new();
    for ((version, manager), at) in latest {
        if newest.get(&manager).is_some_and(|(_, v)| *v == version) {
            writers.entry(version).or_default().push((manager, at));
        }
    }
    for (version, mut managers) in writers {
        // Most recent first.
        managers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let shown: Vec<String> = managers
            .iter()
            .map(|(manager, at)| match at {
                Some(at) => format!("{manager} ({at})"),
                None => manager.clone(),
            })
            .collect();
        problems.push(Problem {
            kind: "WriterOnDeprecatedVersion",
            version: version.clone(),
            objects: 0,
            managers: shown.clone(),
            message: format!(
                "field managers whose latest write went through the deprecated {version}: {}",
                shown.join(", ")
            ),
        });
    }
    CrdAudit {
        name: collected.name.clone(),
        storage_version: storage,
        stored_versions: collected.stored_versions.clone(),
        versions: collected.versions.clone(),
        objects: collected.objects,
        governed_by: collected.governed_by.clone(),
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(manager: &str, version: &str, time: &str) -> Entry {
        Entry {
            manager: manager.into(),
            version: version.into(),
            time: Some(time.parse().expect("time")),
        }
    }

    #[test]
    fn finds_every_kind_of_problem() {
        let flags = |name: &str, served, storage, deprecated| VersionFlags {
            name: name.into(),
            served,
            storage,
            deprecated,
        };
        let collected = Collected {
            name: "widgets.example.com".into(),
            group: "example.com".into(),
            versions: vec![
                flags("v1alpha1", false, false, true),
                flags("v1beta1", true, false, true),
                flags("v1", true, true, false),
            ],
            stored_versions: vec!["v1alpha1".into(), "v1".into()],
            governed_by: None,
            objects: 3,
            entries: vec![
                vec![
                    entry("gitops", "v1alpha1", "2026-01-01T00:00:00Z"),
                    entry("kubectl", "v1beta1", "2026-02-01T00:00:00Z"),
                ],
                vec![entry("gitops", "v1alpha1", "2026-01-02T00:00:00Z")],
                vec![
                    entry("operator", "v1", "2026-03-01T00:00:00Z"),
                    entry("kubectl", "v1", "2026-01-15T00:00:00Z"),
                ],
            ],
            list_error: None,
        };
        let audit = audit(&collected);
        let kinds: Vec<(&str, &str)> = audit
            .problems
            .iter()
            .map(|p| (p.kind, p.version.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("StaleStoredVersions", "v1alpha1"),
                ("ManagedFieldsNameUnservedVersion", "v1alpha1"),
                ("WriterOnDeprecatedVersion", "v1beta1"),
            ]
        );
        assert_eq!(audit.problems[1].objects, 2);
        assert_eq!(audit.problems[1].managers, ["gitops"]);
        // kubectl's latest write (2026-02-01) went through v1beta1.
        assert_eq!(audit.problems[2].managers, ["kubectl (2026-02-01T00:00:00Z)"]);
        assert_eq!(audit.storage_version.as_deref(), Some("v1"));
    }
}
