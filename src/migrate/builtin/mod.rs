//! Kubernetes' built-in storage version migrator: `StorageVersionMigration` objects of
//! `storagemigration.k8s.io` (beta in 1.35-1.36, off by default; needs the
//! kube-controller-manager's `svm` controller). A migration names a group and resource (no
//! version); its conditions go `Running=True/MigrationRunning`, then
//! `Running=False/MigrationCompleted` with `Succeeded=True`, or `Failed=True`; as its end is
//! processed the CRD's `status.storedVersions` is trimmed to the storage version if the CRD's
//! generation did not move, on success (apiserver-samples/35) and on failure alike
//! (tests/fixtures/svm-failed-trims-stored-versions.txt).
//!
//! A migration this operator creates records, in annotations, the state of the CRD it was
//! created for (resourceVersion, generation, `storedVersions`, conversion fingerprint), so
//! that whoever follows it later (another leader) can tell whether it belongs to the CRD as
//! it is now, and what a trim after it may rely on.
//!
//! - `object`: one migration as read (its state, and the CRD state it was created for);
//! - `removals`: whether a migration holds version removals, and which failed ones a run
//!   of ours covers;
//! - `client`: the API at the version the apiserver serves (list, create, mark, delete).

mod client;
mod object;
mod removals;

pub use client::{Listed, Migrations, migration_name};
pub use object::{CreatedFor, Migration, State};
pub use removals::{MAX_COVERED_FAILURES, failure_on_crd, processed_failures, superseded};

/// The API group.
pub const GROUP: &str = "storagemigration.k8s.io";

/// Label on the migrations a policy creates: its name.
pub const POLICY_LABEL: &str = "crdlifecycle.io/policy";

/// Label on the migrations a policy creates: the storage version they migrate into.
pub const STORAGE_VERSION_LABEL: &str = "crdlifecycle.io/storage-version";

/// Annotation on the migrations a policy creates: the CRD's resourceVersion when it was
/// created (where a storage guard for it starts watching).
pub const CRD_RESOURCE_VERSION_ANNOTATION: &str = "crdlifecycle.io/crd-resource-version";

/// Annotation on the migrations a policy creates: the CRD's generation when it was created.
pub const CRD_GENERATION_ANNOTATION: &str = "crdlifecycle.io/crd-generation";

/// Annotation on the migrations a policy creates: the CRD's `status.storedVersions` when it
/// was created, comma-separated.
pub const STORED_VERSIONS_ANNOTATION: &str = "crdlifecycle.io/stored-versions";

/// Annotation on the migrations a policy creates: the fingerprint of the CRD's conversion
/// when it was created (`migrate::conversion_fingerprint`).
pub const CONVERSION_ANNOTATION: &str = "crdlifecycle.io/crd-conversion";

/// Annotation this operator puts on a failed migration of its own once the CRD's
/// `status.storedVersions` lists again every version the migration was created for:
/// Kubernetes ends a failed migration by trimming `storedVersions` to the storage version
/// when the CRD's generation did not move (`finishCRDMigration` in
/// pkg/controller/storageversionmigrator/migrationrunner.go does not look at the outcome),
/// though objects may still be stored in the versions it removed.
pub const RESTORED_ANNOTATION: &str = "crdlifecycle.io/stored-versions-restored";
