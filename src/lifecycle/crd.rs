//! The parts of a CustomResourceDefinition the engine reads and writes, as plain data.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use std::collections::BTreeMap;

/// The lifecycle flags of one entry of a CRD's `spec.versions`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrdVersion {
    pub name: String,
    pub served: bool,
    pub storage: bool,
    pub deprecated: bool,
    pub deprecation_warning: Option<String>,
}

/// A CRD as the engine sees it: its versions in order, `status.storedVersions`, and the
/// versions objects' managedFields may still name.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CrdState {
    pub name: String,
    /// `metadata.generation`: every change of the spec moves it.
    pub generation: Option<i64>,
    pub versions: Vec<CrdVersion>,
    pub stored_versions: Vec<String>,
    /// Versions that objects' `metadata.managedFields` may still name (no cleanup has
    /// rewritten them since they were unserved): removing one would break server-side apply
    /// of those objects (apiserver-samples/29), so its removal waits.
    pub managed_fields_pending: Vec<String>,
    /// What every removal waits for while another migrator's migration of the CRD's objects
    /// is unfinished ("StorageVersionMigration X has finished", or why that cannot be told):
    /// Kubernetes' migrator can trim `storedVersions` before it has rewritten every object.
    pub unfinished_migration: Option<String>,
    /// Each version's `schema.openAPIV3Schema` (JSON), where it has one: declarative
    /// conversion must cover every field that differs between adjacent versions.
    pub schemas: BTreeMap<String, serde_json::Value>,
}

impl CrdState {
    /// Reads the flags and stored versions of a CRD.
    pub fn from_crd(crd: &CustomResourceDefinition) -> Self {
        Self {
            name: crd.metadata.name.clone().unwrap_or_default(),
            generation: crd.metadata.generation,
            versions: crd
                .spec
                .versions
                .iter()
                .map(|v| CrdVersion {
                    name: v.name.clone(),
                    served: v.served,
                    storage: v.storage,
                    deprecated: v.deprecated.unwrap_or(false),
                    deprecation_warning: v.deprecation_warning.clone(),
                })
                .collect(),
            stored_versions: crd
                .status
                .as_ref()
                .and_then(|s| s.stored_versions.clone())
                .unwrap_or_default(),
            managed_fields_pending: Vec::new(),
            unfinished_migration: None,
            schemas: crate::schema::schemas_of(crd),
        }
    }

    /// The version marked `storage: true`, if exactly one is.
    pub fn storage_version(&self) -> Option<&str> {
        let mut stored = self.versions.iter().filter(|v| v.storage);
        match (stored.next(), stored.next()) {
            (Some(v), None) => Some(&v.name),
            _ => None,
        }
    }

    /// Whether `status.storedVersions` lists a version other than the storage version:
    /// objects may still be stored in it, and a migration is due.
    pub fn stores_other_versions(&self) -> bool {
        self.storage_version()
            .is_some_and(|storage| self.stored_versions.iter().any(|v| v != storage))
    }

    pub fn version(&self, name: &str) -> Option<&CrdVersion> {
        self.versions.iter().find(|v| v.name == name)
    }

    /// `status.storedVersions`, or the storage version when the status has none yet (as for
    /// a CRD manifest that was never applied).
    pub fn effective_stored_versions(&self) -> Vec<String> {
        if self.stored_versions.is_empty() {
            self.storage_version()
                .map(|s| vec![s.to_owned()])
                .unwrap_or_default()
        } else {
            self.stored_versions.clone()
        }
    }

    pub fn version_names(&self) -> String {
        self.versions
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
