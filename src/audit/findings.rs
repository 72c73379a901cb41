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

impl Entry {
    /// The entries of one object's `metadata.managedFields` (JSON) that name a version of
    /// `group`; entries of other groups (the object's other APIs) are left out.
    pub fn of_group(group: &str, managed_fields: &[serde_json::Value]) -> Vec<Entry> {
        managed_fields
            .iter()
            .filter_map(|entry| {
                let (entry_group, version) = entry["apiVersion"].as_str()?.rsplit_once('/')?;
                (entry_group == group).then(|| Entry {
                    manager: entry["manager"].as_str().unwrap_or_default().to_owned(),
                    version: version.to_owned(),
                    time: entry["time"].as_str().and_then(|t| t.parse().ok()),
                })
            })
            .collect()
    }
}

/// The field managers' writes through each version of a CRD, folded one object at a time
/// as the objects are listed: it grows with the versions and managers, not with the
/// objects (5,000 objects of 10 entries each fold into one entry per version and manager).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Writes {
    /// Objects folded in.
    pub objects: u64,
    /// Per version an entry named.
    pub versions: BTreeMap<String, VersionWrites>,
}

/// The writes through one version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionWrites {
    /// Objects with at least one entry naming the version.
    pub objects: u64,
    /// Per field manager.
    pub managers: BTreeMap<String, ManagerWrites>,
}

/// One field manager's writes through one version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagerWrites {
    /// Objects with an entry of the manager naming the version.
    pub objects: u64,
    /// The newest `time` of those entries (`None` when none has one).
    pub last_write: Option<Timestamp>,
}

impl Writes {
    /// Adds one object's entries.
    pub fn add(&mut self, entries: &[Entry]) {
        self.objects += 1;
        for (i, entry) in entries.iter().enumerate() {
            // Counted once per object, however many entries it has.
            let earlier = &entries[..i];
            let version = self.versions.entry(entry.version.clone()).or_default();
            if !earlier.iter().any(|e| e.version == entry.version) {
                version.objects += 1;
            }
            let manager = version.managers.entry(entry.manager.clone()).or_default();
            if !earlier
                .iter()
                .any(|e| e.version == entry.version && e.manager == entry.manager)
            {
                manager.objects += 1;
            }
            manager.last_write = manager.last_write.max(entry.time);
        }
    }

    /// Each field manager's last write through `version` (managers whose entries carry no
    /// time are left out).
    pub fn last_writes(&self, version: &str) -> Vec<(String, Timestamp)> {
        self.versions
            .get(version)
            .into_iter()
            .flat_map(|v| &v.managers)
            .filter_map(|(manager, writes)| Some((manager.clone(), writes.last_write?)))
            .collect()
    }
}

/// What an audit collected of one CRD.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub name: String,
    pub group: String,
    pub versions: Vec<VersionFlags>,
    pub stored_versions: Vec<String>,
    pub governed_by: Option<String>,
    /// Its objects' writes (`Writes::objects` is how many objects it has).
    pub writes: Writes,
    /// Why the objects could not be listed (their problems are then unknown).
    pub list_error: Option<String>,
}

/// A field manager and its writes through a version, as `audit -o json` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Writer {
    pub manager: String,
    /// Its latest write through the version (RFC 3339; `null` when its entries carry no
    /// time).
    pub last_write: Option<Timestamp>,
    /// Objects it wrote through the version.
    pub objects: u64,
}

impl Writer {
    fn of(manager: &str, writes: &ManagerWrites) -> Writer {
        Writer {
            manager: manager.to_owned(),
            last_write: writes.last_write,
            objects: writes.objects,
        }
    }
}

impl std::fmt::Display for Writer {
    /// `manager (time)`, or the manager alone without a time.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.last_write {
            Some(at) => write!(f, "{} ({at})", self.manager),
            None => f.write_str(&self.manager),
        }
    }
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
    /// The field managers it concerns, each with its latest write through the version (for
    /// `WriterOnDeprecatedVersion`, most recent first).
    pub managers: Vec<Writer>,
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
    let writes = &collected.writes;
    // Entries naming versions that are not served (or gone from the CRD).
    for (version, through) in writes
        .versions
        .iter()
        .filter(|(v, _)| !served.contains(v.as_str()))
    {
        let in_crd = collected.versions.iter().any(|v| v.name == *version);
        let managers: Vec<Writer> = through
            .managers
            .iter()
            .map(|(manager, w)| Writer::of(manager, w))
            .collect();
        let names: Vec<&str> = managers.iter().map(|w| w.manager.as_str()).collect();
        problems.push(Problem {
            kind: "ManagedFieldsNameUnservedVersion",
            version: version.clone(),
            objects: through.objects,
            message: format!(
                "{} objects have managedFields entries naming {version}, which is {}: server-side apply by {} breaks once it is removed (`crd-lifecycle repair-managed-fields {}` rewrites them)",
                through.objects,
                if in_crd { "not served" } else { "not in the CRD" },
                names.join(", "),
                collected.name
            ),
            managers,
        });
    }
    // The version of each manager's latest write, whatever the version (the last in
    // version order on a tie).
    let mut newest: BTreeMap<&str, (Option<Timestamp>, &str)> = BTreeMap::new();
    for (version, through) in &writes.versions {
        for (manager, w) in &through.managers {
            let best = newest.entry(manager.as_str()).or_insert((None, version.as_str()));
            if w.last_write >= best.0 {
                *best = (w.last_write, version.as_str());
            }
        }
    }
    // Writers whose latest write went through a deprecated version.
    for version in &deprecated {
        let Some(through) = writes.versions.get(*version) else {
            continue;
        };
        let mut managers: Vec<Writer> = through
            .managers
            .iter()
            .filter(|(manager, _)| newest.get(manager.as_str()).is_some_and(|(_, v)| v == version))
            .map(|(manager, w)| Writer::of(manager, w))
            .collect();
        if managers.is_empty() {
            continue;
        }
        // Most recent first.
        managers.sort_by(|a, b| b.last_write.cmp(&a.last_write).then(a.manager.cmp(&b.manager)));
        let shown: Vec<String> = managers.iter().map(Writer::to_string).collect();
        problems.push(Problem {
            kind: "WriterOnDeprecatedVersion",
            version: (*version).to_owned(),
            objects: 0,
            managers,
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
        objects: writes.objects,
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
            writes: Writes::default(),
            list_error: None,
        };
        let mut collected = collected;
        for object in [
            vec![
                entry("gitops", "v1alpha1", "2026-01-01T00:00:00Z"),
                entry("kubectl", "v1beta1", "2026-02-01T00:00:00Z"),
            ],
            vec![entry("gitops", "v1alpha1", "2026-01-02T00:00:00Z")],
            vec![
                entry("operator", "v1", "2026-03-01T00:00:00Z"),
                entry("kubectl", "v1", "2026-01-15T00:00:00Z"),
            ],
        ] {
            collected.writes.add(&object);
        }
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
        assert_eq!(audit.objects, 3);
        assert_eq!(audit.problems[1].objects, 2);
        assert_eq!(
            audit.problems[1].managers,
            [Writer {
                manager: "gitops".into(),
                last_write: Some("2026-01-02T00:00:00Z".parse().expect("time")),
                objects: 2
            }]
        );
        // kubectl's latest write (2026-02-01) went through v1beta1.
        let shown: Vec<String> = audit.problems[2].managers.iter().map(Writer::to_string).collect();
        assert_eq!(shown, ["kubectl (2026-02-01T00:00:00Z)"]);
        assert_eq!(audit.storage_version.as_deref(), Some("v1"));
    }

    #[test]
    fn writes_count_each_object_once_per_version_and_manager() {
        let mut writes = Writes::default();
        // An Apply and an Update entry of the same manager, and its status subresource's.
        writes.add(&[
            entry("gitops", "v1", "2026-01-01T00:00:00Z"),
            entry("gitops", "v1", "2026-01-03T00:00:00Z"),
            entry("gitops", "v1beta1", "2026-01-02T00:00:00Z"),
            entry("kubectl", "v1", "2026-01-02T00:00:00Z"),
        ]);
        writes.add(&[Entry {
            manager: "job".into(),
            version: "v1".into(),
            time: None,
        }]);
        assert_eq!(writes.objects, 2);
        let v1 = &writes.versions["v1"];
        assert_eq!(v1.objects, 2);
        assert_eq!(
            v1.managers["gitops"],
            ManagerWrites {
                objects: 1,
                last_write: Some("2026-01-03T00:00:00Z".parse().expect("time"))
            }
        );
        assert_eq!(writes.versions["v1beta1"].objects, 1);
        // A manager without a time has no last write for the writers gate.
        let last: Vec<String> = writes.last_writes("v1").into_iter().map(|(m, _)| m).collect();
        assert_eq!(last, ["gitops", "kubectl"]);
    }

    #[test]
    fn entries_of_other_groups_are_left_out() {
        let fields = serde_json::json!([
            {"manager": "kubectl", "operation": "Update", "apiVersion": "example.com/v1", "time": "2026-01-02T00:00:00Z"},
            {"manager": "kubectl", "operation": "Update", "apiVersion": "other.io/v1"},
            {"manager": "old", "operation": "Apply", "apiVersion": "example.com/v1alpha1"},
        ]);
        let entries = Entry::of_group("example.com", fields.as_array().expect("entries"));
        assert_eq!(
            entries,
            [
                Entry {
                    manager: "kubectl".into(),
                    version: "v1".into(),
                    time: Some("2026-01-02T00:00:00Z".parse().expect("time"))
                },
                Entry {
                    manager: "old".into(),
                    version: "v1alpha1".into(),
                    time: None
                },
            ]
        );
    }
}
