//! What a failed StorageVersionMigration took from the CRD's `status.storedVersions`, put
//! back: what it listed when the migration was created (the policy's own), or every version
//! of the CRD (someone else's failure, or the CRD's record of one), so that the next
//! migration rewrites every object. Only ever adds versions the CRD has.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use tracing::warn;

use crate::api::{MigrationPhase, VersionPolicy};
use crate::controller::jobs::BackgroundJobs;
use crate::controller::jobs::migrator_job::MigratorJob;
use crate::migrate::builtin::{self, CreatedFor, Migration, State};

impl BackgroundJobs {
    /// Restores what the policy's own failed StorageVersionMigration (named in
    /// `status.migration`) had in `storedVersions`, as soon as Kubernetes has processed its
    /// end, at every reconcile rather than only when a removal is due: a migration deleted
    /// meanwhile would take the knowledge with it. One GET, only while the status says the
    /// last migration failed.
    pub(crate) async fn restore_after_failure(&self, policy: &VersionPolicy) {
        let Some(name) = MigratorJob::Migrate
            .previous(policy)
            .filter(|run| run.phase == MigrationPhase::Failed)
            .and_then(|run| run.storage_version_migration)
        else {
            return;
        };
        let Ok(Some(api)) = self.builtin_api().await else {
            return;
        };
        let crd = &policy.spec.crd_name;
        match api.get(&name).await {
            Ok((migration, _)) => {
                if let (State::Failed(_), false, false, Some(created_for)) = (
                    &migration.state,
                    migration.running,
                    migration.restored,
                    &migration.created_for,
                ) && migration.policy.as_deref() == policy.metadata.name.as_deref()
                    && let Err(error) = self
                        .restore_stored_versions(crd, &migration, created_for, &api)
                        .await
                {
                    warn!(
                        crd,
                        error, "cannot restore status.storedVersions after a failed StorageVersionMigration"
                    );
                }
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => warn!(crd, error = %error, "cannot read StorageVersionMigration {name}"),
        }
    }

    /// Lists every version the CRD has in its `status.storedVersions`, guarded by the
    /// resourceVersion just read, after a failed StorageVersionMigration that no migration
    /// since covers (`failure`: which one, or the CRD's record of it) trimmed it: whatever it
    /// trimmed is back, and the next migration rewrites every object. Adding a version the
    /// CRD has is always safe: at worst it asks for a migration that finds nothing to rewrite.
    pub(super) async fn list_every_version(&self, crd: &str, failure: &str) -> Result<(), String> {
        let listed = self
            .add_stored_versions(crd, |current| {
                current.spec.versions.iter().map(|v| v.name.clone()).collect()
            })
            .await
            .map_err(|e| format!("cannot list every version in status.storedVersions of {crd} again: {e}"))?;
        if !listed.is_empty() {
            warn!(
                crd,
                failure,
                listed = listed.join(", "),
                "a StorageVersionMigration failed and no migration since covers it; listed every version in \
                 status.storedVersions again, so that the next migration rewrites every object"
            );
        }
        Ok(())
    }

    /// Adds to the CRD's `status.storedVersions` those of `wanted(crd)` that the CRD has and
    /// it does not list, in one merge patch guarded by the resourceVersion just read (a quorum
    /// read). Returns what it added (nothing: no write).
    async fn add_stored_versions(
        &self,
        crd: &str,
        wanted: impl Fn(&CustomResourceDefinition) -> Vec<String>,
    ) -> Result<Vec<String>, String> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let current = crds
            .get(crd)
            .await
            .map_err(|e| format!("cannot read CustomResourceDefinition {crd}: {e}"))?;
        let mut stored = current
            .status
            .as_ref()
            .and_then(|s| s.stored_versions.clone())
            .unwrap_or_default();
        let added: Vec<String> = wanted(&current)
            .into_iter()
            .filter(|v| !stored.contains(v) && current.spec.versions.iter().any(|w| &w.name == v))
            .collect();
        if added.is_empty() {
            return Ok(added);
        }
        stored.extend(added.iter().cloned());
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "status": {"storedVersions": stored},
        });
        crds.patch_status(crd, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| e.to_string())?;
        Ok(added)
    }

    /// Adds back to the CRD's `status.storedVersions` every version it listed when
    /// `migration` was created and still has, guarded by the resourceVersion just read, then
    /// marks the migration (`builtin::RESTORED_ANNOTATION`). Adding a version the CRD has is
    /// always safe: at worst it asks for a migration that finds nothing to rewrite.
    pub(super) async fn restore_stored_versions(
        &self,
        crd: &str,
        migration: &Migration,
        created_for: &CreatedFor,
        api: &builtin::Migrations,
    ) -> Result<(), String> {
        let lost = self
            .add_stored_versions(crd, |_| created_for.stored_versions.clone())
            .await
            .map_err(|e| format!("cannot restore status.storedVersions of {crd}: {e}"))?;
        if !lost.is_empty() {
            warn!(
                crd,
                migration = migration.name,
                restored = lost.join(", "),
                "StorageVersionMigration failed and Kubernetes trimmed status.storedVersions; restored what it listed"
            );
        }
        api.mark_restored(&migration.name)
            .await
            .map_err(|e| format!("cannot annotate StorageVersionMigration {}: {e}", migration.name))
    }
}
