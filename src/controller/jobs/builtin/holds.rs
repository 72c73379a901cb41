//! What the resource's StorageVersionMigrations hold: no migration of ours starts while
//! another is unfinished, and no removal lands while one is unfinished or failed without a
//! run since that covers it (`covers_failed_migrations`: an order of events, never two
//! clocks); what a run starting now covers.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use tracing::warn;

use super::group_resource;
use crate::api::{MigrationPhase, MigrationStatus, VersionPolicy};
use crate::controller::jobs::BackgroundJobs;
use crate::controller::jobs::migrator_job::MigratorJob;
use crate::migrate::builtin::{self, Migration, State};

impl BackgroundJobs {
    /// An unfinished StorageVersionMigration of the policy's CRD (not counting this
    /// policy's own when `except_ours`): while one runs, no migration of ours starts. `Err`
    /// when that cannot be told (the API's discovery or the list failed): no migration of
    /// ours starts either, since two migrators could run at once.
    ///
    /// One of the policy's own that Kubernetes has not started (`Pending`) and that was
    /// created for another storage version than `storage_version` (the CRD's now) is deleted
    /// first, also when this controller's job follows it (the reconcile then launches the
    /// migration into the storage version now, which replaces that job; if none can start
    /// yet, the job ends with an error saying so): Kubernetes' migrator would rewrite
    /// into the storage version of the moment it starts, through apiservers nobody confirmed
    /// act on it, and trim `status.storedVersions` (simulation seed 924: created for v1,
    /// started after `kubectl edit` moved the storage back to v1beta1, it trimmed v1 while a
    /// lagging apiserver had written objects as v1; the same with the job still following
    /// it). The controller never moves the storage version under a migration of its own
    /// (`lifecycle::gates::migration_gate`), so only someone else's change does this. A deleted Pending migration
    /// never runs (tests/fixtures/apiserver/svm-delete-v1.36.txt).
    pub(crate) async fn unfinished_migration(
        &self,
        policy: &VersionPolicy,
        except_ours: bool,
        storage_version: Option<&str>,
    ) -> Result<Option<String>, String> {
        let Some(api) = self.builtin_api().await? else {
            return Ok(None);
        };
        let crd = &policy.spec.crd_name;
        let (group, resource) = group_resource(crd);
        let name = policy.metadata.name.as_deref();
        let listed = api.of_resource(group, resource).await.map_err(|error| {
            warn!(crd, error = %error, "cannot list StorageVersionMigrations");
            format!("cannot list StorageVersionMigrations: {error}")
        })?;
        let mut unfinished = None;
        for migration in listed.migrations {
            let ours = migration.policy.as_deref() == name;
            if migration.state.is_finished() {
                continue;
            }
            if ours
                && migration.state == State::Pending
                && storage_version.is_some()
                && migration.storage_version.as_deref() != storage_version
            {
                match api.delete_as_read(&migration).await {
                    // Started since it was listed: kept, and waited for as unfinished.
                    Ok(false) => {}
                    Ok(true) => {
                        warn!(
                            crd,
                            migration = migration.name,
                            created_for = migration.storage_version.as_deref().unwrap_or_default(),
                            storage_version = storage_version.unwrap_or_default(),
                            "deleted this policy's StorageVersionMigration that Kubernetes had not started: it was \
                             created for another storage version"
                        );
                        continue;
                    }
                    Err(error) => {
                        warn!(crd, migration = migration.name, error = %error, "cannot delete a StorageVersionMigration created for another storage version");
                    }
                }
            }
            if !(except_ours && ours) && unfinished.is_none() {
                unfinished = Some(migration.name);
            }
        }
        Ok(unfinished)
    }

    /// What every removal of a version of the policy's CRD waits for among the resource's
    /// StorageVersionMigrations (`Migration::holds_removals`): "StorageVersionMigration X has
    /// finished", or what else must happen. `Err` when that cannot be told. A failed
    /// migration holds no more once a later one succeeded (`builtin::superseded`), or this
    /// policy's own last run into `storage_version` (the storage version now) rewrote every
    /// object and had seen the failure processed before it listed the first
    /// (`covers_failed_migrations`: an order of events, not of two clocks), or, for one of
    /// this policy's own, once the `storedVersions` it was created for are restored, which
    /// this does unless `dry_run`: Kubernetes trims them as a failed migration ends
    /// (tests/fixtures/svm-failed-trims-stored-versions.txt). Someone else's failure, which
    /// records no `storedVersions`, gets every version of the CRD listed again instead (also
    /// unless `dry_run`): the next migration then rewrites every object, and covers it.
    pub(crate) async fn removal_hold(
        &self,
        policy: &VersionPolicy,
        storage_version: Option<&str>,
        dry_run: bool,
    ) -> Result<Option<String>, String> {
        let Some(api) = self.builtin_api().await? else {
            return Ok(None);
        };
        let crd = &policy.spec.crd_name;
        let (group, resource) = group_resource(crd);
        let listed = api.of_resource(group, resource).await.map_err(|error| {
            warn!(crd, error = %error, "cannot list StorageVersionMigrations");
            format!("cannot list StorageVersionMigrations: {error}")
        })?;
        let covered = covered_failures(policy, storage_version);
        for migration in listed.migrations.iter().filter(|m| m.holds_removals()) {
            if !matches!(migration.state, State::Failed(_)) || migration.running {
                return Ok(Some(format!(
                    "StorageVersionMigration {} has finished",
                    migration.name
                )));
            }
            let run_since = migration.uid.as_ref().is_some_and(|uid| covered.contains(uid));
            if run_since || builtin::superseded(migration, &listed.migrations) {
                continue;
            }
            if let Some(hold) = self
                .failed_hold(policy, migration, storage_version, dry_run, &covered, &api)
                .await
            {
                return Ok(Some(hold));
            }
        }
        Ok(None)
    }

    /// What a removal waits for after `migration`, a failed StorageVersionMigration that no
    /// later one superseded and no run in `covered` covers (`removal_hold`); `None` once it
    /// holds no more (the `storedVersions` it was created for restored, or a run that ended
    /// meanwhile covers it).
    async fn failed_hold(
        &self,
        policy: &VersionPolicy,
        migration: &Migration,
        storage_version: Option<&str>,
        dry_run: bool,
        covered: &[String],
        api: &builtin::Migrations,
    ) -> Option<String> {
        let crd = &policy.spec.crd_name;
        let ours = migration.policy.as_deref() == policy.metadata.name.as_deref();
        let hold = match (&migration.created_for, ours, dry_run) {
            (Some(created_for), true, false) => {
                match self
                    .restore_stored_versions(crd, migration, created_for, api)
                    .await
                {
                    Ok(()) => return None,
                    Err(error) => format!(
                        "status.storedVersions lists again what it listed when StorageVersionMigration {} \
                         was created ({error})",
                        migration.name
                    ),
                }
            }
            (Some(_), true, true) => format!(
                "status.storedVersions lists again what it listed when StorageVersionMigration {} was \
                 created (Kubernetes trims it as a failed migration ends; not restored in a dry run)",
                migration.name
            ),
            (_, _, false) if !policy.spec.migration.enabled => format!(
                "StorageVersionMigration {}, which failed, is followed by a migration that succeeds, or is \
                 deleted once every object of {crd} is rewritten (`crd-lifecycle migrate {crd}`; Kubernetes \
                 trims status.storedVersions as a failed migration ends, so objects may be stored in a version \
                 it no longer lists; spec.migration.enabled is false, so this controller does not migrate)",
                migration.name
            ),
            (_, _, false) if covered.len() >= builtin::MAX_COVERED_FAILURES => format!(
                "StorageVersionMigration {}, which failed, is deleted once every object of {crd} is rewritten: \
                 more than {} failed StorageVersionMigrations of the resource that no later one superseded are \
                 more than one run records, and another run would not cover this one either",
                migration.name,
                builtin::MAX_COVERED_FAILURES
            ),
            (_, _, false) => {
                // The run that covers it may have ended after the policy this reconcile
                // decided on was read: another full run would cost the cluster a rewrite.
                let fresh = self.fresh(policy.clone()).await;
                if migration
                    .uid
                    .as_ref()
                    .is_some_and(|uid| covered_failures(&fresh, storage_version).contains(uid))
                {
                    return None;
                }
                self.relisted_hold(crd, migration).await
            }
            (_, _, true) => format!(
                "StorageVersionMigration {}, which failed, is followed by a migration that succeeds, or is \
                 deleted once every object of {crd} is rewritten (Kubernetes trims status.storedVersions as a \
                 failed migration ends too: list every version of {crd} in status.storedVersions again, and the \
                 next migration rewrites every object; not done in a dry run)",
                migration.name
            ),
        };
        Some(hold)
    }

    /// Lists every version of the CRD in `status.storedVersions` again after `failed`
    /// (`list_every_version`) and says what the removal now waits for.
    async fn relisted_hold(&self, crd: &str, failed: &Migration) -> String {
        match self
            .list_every_version(crd, &format!("StorageVersionMigration {}", failed.name))
            .await
        {
            Ok(()) => format!(
                "a migration of every object of {crd} that starts after StorageVersionMigration {}, which failed \
                 (Kubernetes trims status.storedVersions as a failed migration ends, so every version of {crd} is \
                 listed there again and the next migration rewrites every object)",
                failed.name
            ),
            Err(error) => format!(
                "StorageVersionMigration {}, which failed, is followed by a migration of every object of {crd}: \
                 {error}",
                failed.name
            ),
        }
    }

    /// What a run starting now covers (`MigrationStatus::covers_failed_migrations` and
    /// `covers_failed_migration_on_crd`), read before it lists its first object: the failed
    /// StorageVersionMigrations of the CRD's resource whose end Kubernetes has processed, and
    /// the CRD's own record of a failure. Nothing of what cannot be read: the run then
    /// covers less, which costs at most one more full run.
    pub(in crate::controller::jobs) async fn processed_failures(
        &self,
        crd: &str,
    ) -> (Vec<String>, Option<String>) {
        let on_crd = match Api::<CustomResourceDefinition>::all(self.client.clone())
            .get(crd)
            .await
        {
            Ok(read) => builtin::failure_on_crd(&read),
            Err(error) => {
                warn!(crd, error = %error, "cannot read the CRD; this run covers no failed StorageVersionMigration it records");
                None
            }
        };
        let Ok(Some(api)) = self.builtin_api().await else {
            return (Vec::new(), on_crd);
        };
        let (group, resource) = group_resource(crd);
        match api.of_resource(group, resource).await {
            Ok(listed) => (builtin::processed_failures(&listed.migrations), on_crd),
            Err(error) => {
                warn!(crd, error = %error, "cannot list StorageVersionMigrations; this run covers no failed one");
                (Vec::new(), on_crd)
            }
        }
    }

    /// After a StorageVersionMigration of the CRD's resource failed, as the CRD records it
    /// (`failure`, `builtin::failure_on_crd`), and no run of the policy covers it: lists
    /// every version of the CRD in `status.storedVersions` again, so that the next migration
    /// rewrites every object. At any reconcile, not only once a removal is due: the failed
    /// migration may be deleted before then, or have been while no controller ran, and the
    /// CRD's record is then all that is left. `Ok(true)` when no run covers it (every
    /// version is listed again: a removal waits for the migration that follows), `Err` when
    /// the write failed (look again soon).
    pub(crate) async fn list_again_after_failure_on_crd(
        &self,
        policy: &VersionPolicy,
        storage_version: Option<&str>,
        failure: &str,
    ) -> Result<bool, String> {
        let covered = |policy: &VersionPolicy| {
            covered_run(policy, storage_version)
                .and_then(|run| run.covers_failed_migration_on_crd)
                .is_some_and(|seen| seen == failure)
        };
        if covered(policy) || covered(&self.fresh(policy.clone()).await) {
            return Ok(false);
        }
        self.list_every_version(&policy.spec.crd_name, &format!("recorded on the CRD: {failure}"))
            .await
            .map(|()| true)
    }
}

/// The failed StorageVersionMigrations (UIDs) that the policy's last run covers: one that
/// succeeded into `storage_version` (the storage version now) and rewrote every object (a run
/// that found storedVersions trimmed already, by the very failure it would release, did not).
fn covered_failures(policy: &VersionPolicy, storage_version: Option<&str>) -> Vec<String> {
    covered_run(policy, storage_version)
        .map(|run| run.covers_failed_migrations)
        .unwrap_or_default()
}

/// The policy's last run if it covers failures: it succeeded into `storage_version` (the
/// storage version now) and rewrote every object.
fn covered_run(policy: &VersionPolicy, storage_version: Option<&str>) -> Option<MigrationStatus> {
    MigratorJob::Migrate.previous(policy).filter(|run| {
        run.phase == MigrationPhase::Succeeded
            && run.rewrote_all
            && Some(run.storage_version.as_str()) == storage_version
    })
}
