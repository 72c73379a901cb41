//! What a migration works on: a CRD's resource and its storage version, as read from the
//! CRD at the start of the run.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// The resource of a CRD, served through its storage version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub crd: String,
    pub group: String,
    pub plural: String,
    /// `spec.names.kind`.
    pub kind: String,
    pub storage_version: String,
    /// The version requests go through: the storage version, or for a conversion
    /// preflight the version a `store` is about to switch to.
    pub version: String,
    pub namespaced: bool,
    /// The CRD's generation when the run started.
    pub generation: Option<i64>,
    /// What the rewrite's conversion goes through (the CRD's `spec.conversion` without its
    /// `caBundle`, and the declarative conversion recorded on it), as a fingerprint: only a
    /// change of it or of the storage version restarts a run.
    pub conversion: String,
    /// The CRD's `status.storedVersions` when the run started.
    pub stored_versions: Vec<String>,
    /// Rewrites go through this subresource (`status`) instead of the main resource.
    pub subresource: Option<String>,
    /// Every version in the CRD's `spec.versions`.
    pub versions: Vec<String>,
    /// The versions the CRD serves.
    pub served: Vec<String>,
    /// Each version's `schema.openAPIV3Schema` (JSON), where it has one.
    pub schemas: std::collections::BTreeMap<String, serde_json::Value>,
    /// The CRD's resourceVersion when it was read: unchanged at the trim, the storage
    /// version confirmed before the rewrites still holds.
    pub resource_version: Option<String>,
    /// The newest `time` of the CRD's managedFields entries (the apiserver's clock, sample
    /// 02): no field of the CRD changed after it. `None` without entries.
    pub changed_at: Option<jiff::Timestamp>,
    /// The apiserver's clock when the CRD was read (the answer's `date` header,
    /// tests/fixtures/apiserver/crd-get-date-header.txt); `None` when unknown.
    pub read_at: Option<jiff::Timestamp>,
    /// With `Mode::Rewrite`: the state of the CRD the run's storage guard watches from (the
    /// start of this run, or of the run it resumes); a checkpoint records it.
    pub watched_from: Option<super::GuardStart>,
}

/// A fingerprint of what converting an object of the CRD goes through.
pub fn conversion_fingerprint(crd: &CustomResourceDefinition) -> String {
    let mut conversion = serde_json::to_value(&crd.spec.conversion).unwrap_or_default();
    if let Some(config) = conversion
        .pointer_mut("/webhook/clientConfig")
        .and_then(|c| c.as_object_mut())
    {
        // A rotated CA changes how the webhook is trusted, not how objects convert.
        config.remove("caBundle");
    }
    let recorded = crd
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::conversion::CRD_CONVERSION_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{conversion}|{recorded}").as_bytes(),
    );
    digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The newest `time` of a CRD's managedFields entries: a manager's entry takes the time of
/// every change to the fields it owns (sample 02), so no field changed after it. `None` when
/// an entry has no time (nothing to bound the last change with).
pub fn last_changed(crd: &CustomResourceDefinition) -> Option<jiff::Timestamp> {
    let entries = crd.metadata.managed_fields.as_ref()?;
    let mut newest: Option<jiff::Timestamp> = None;
    for entry in entries {
        let time = entry.time.as_ref()?.0;
        newest = Some(newest.map_or(time, |n| n.max(time)));
    }
    newest
}

impl Target {
    /// Whether the CRD had not changed for `quiet` when it was read, on the apiserver's
    /// clock alone (its managedFields times against the `date` of the answer they came in):
    /// this machine's clock may be skewed. Unknown (no entries, no `date`): `false`.
    pub fn unchanged_for(&self, quiet: std::time::Duration) -> bool {
        match (self.changed_at, self.read_at) {
            (Some(changed), Some(read)) => read.duration_since(changed).as_secs_f64() >= quiet.as_secs_f64(),
            _ => false,
        }
    }

    /// Reads the target from a CRD, refusing CRDs the migrator cannot work on.
    pub fn from_crd(crd: &CustomResourceDefinition) -> Result<Target, String> {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let storage: Vec<_> = crd.spec.versions.iter().filter(|v| v.storage).collect();
        let [storage] = storage.as_slice() else {
            return Err(format!(
                "{name} has {} storage versions; it needs exactly one",
                storage.len()
            ));
        };
        // An unserved storage version answers every request with a plain 404
        // (apiserver-samples/15): objects would look deleted, and a trim would lose them.
        if !storage.served {
            return Err(format!(
                "the storage version {} of {name} is not served, so its objects cannot be read or rewritten",
                storage.name
            ));
        }
        Ok(Target {
            crd: name,
            group: crd.spec.group.clone(),
            plural: crd.spec.names.plural.clone(),
            kind: crd.spec.names.kind.clone(),
            storage_version: storage.name.clone(),
            version: storage.name.clone(),
            namespaced: crd.spec.scope == "Namespaced",
            generation: crd.metadata.generation,
            conversion: conversion_fingerprint(crd),
            stored_versions: crd
                .status
                .as_ref()
                .and_then(|s| s.stored_versions.clone())
                .unwrap_or_default(),
            subresource: None,
            versions: crd.spec.versions.iter().map(|v| v.name.clone()).collect(),
            served: crd
                .spec
                .versions
                .iter()
                .filter(|v| v.served)
                .map(|v| v.name.clone())
                .collect(),
            schemas: crate::schema::schemas_of(crd),
            resource_version: crd.metadata.resource_version.clone(),
            changed_at: last_changed(crd),
            read_at: None,
            watched_from: None,
        })
    }

    /// Sends rewrites through the `/status` subresource, which the storage version must
    /// have (apiserver-samples/31: a no-op patch there re-encodes the whole object too).
    pub fn through_status(mut self, crd: &CustomResourceDefinition) -> Result<Target, String> {
        let has_status = crd
            .spec
            .versions
            .iter()
            .find(|v| v.name == self.storage_version)
            .and_then(|v| v.subresources.as_ref())
            .is_some_and(|s| s.status.is_some());
        if !has_status {
            return Err(format!(
                "rewrites through /status need a status subresource, and the storage version {} of {} has none \
                 (spec.versions[].subresources.status); rewrite through the main resource instead",
                self.storage_version, self.crd
            ));
        }
        self.subresource = Some("status".to_owned());
        Ok(self)
    }

    /// Reads through another (served) version of the CRD instead of the storage version.
    pub fn through(mut self, crd: &CustomResourceDefinition, version: &str) -> Result<Target, String> {
        match crd.spec.versions.iter().find(|v| v.name == version) {
            Some(v) if v.served => {
                self.version = version.to_owned();
                Ok(self)
            }
            Some(_) => Err(format!("version {version} of {} is not served", self.crd)),
            None => Err(format!("{} has no version {version}", self.crd)),
        }
    }

    /// Stored versions other than the storage version: what the migration gets rid of.
    pub fn stale_versions(&self) -> Vec<String> {
        self.stored_versions
            .iter()
            .filter(|v| **v != self.storage_version)
            .cloned()
            .collect()
    }

    /// `/apis/<group>/<version>/<plural>`: every object, across namespaces.
    pub fn list_path(&self) -> String {
        format!("/apis/{}/{}/{}", self.group, self.version, self.plural)
    }

    /// The collection an object belongs to (its URL without the name).
    pub fn collection_path(&self, namespace: Option<&str>) -> String {
        match namespace.filter(|_| self.namespaced) {
            Some(ns) => format!(
                "/apis/{}/{}/namespaces/{ns}/{}",
                self.group, self.version, self.plural
            ),
            None => self.list_path(),
        }
    }
}
