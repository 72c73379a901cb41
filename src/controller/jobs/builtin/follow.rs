//! Following one StorageVersionMigration of the policy's: found or created for the CRD as
//! it is now (`create`), polled to its end into `status.migration`, and `storedVersions`
//! trimmed after it if Kubernetes did not (relying on the CRD as the migration was created
//! for it).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::time::Instant;
use tracing::warn;

use super::between;
use crate::api::{MigrationStatus, VersionPolicy};
use crate::controller::jobs::BackgroundJobs;
use crate::controller::jobs::end::RunEnd;
use crate::controller::jobs::migration::MAX_RERUNS;
use crate::controller::jobs::migrator_job::MigratorJob;
use crate::migrate::builtin::{self, Migration, State};
use crate::migrate::{self, Outcome};

/// How long a failed migration is followed until Kubernetes has processed its end (and
/// trimmed storedVersions), so that they can be restored at once.
const FAILED_END_WAIT: Duration = Duration::from_secs(60);

/// How following one migration ended.
enum Followed {
    Succeeded,
    /// Failed, or never picked up (the reason is in the status message).
    Failed,
    /// Deleted before Kubernetes started it: the storage version moved on
    /// (`unfinished_migration`).
    Deleted,
}

impl BackgroundJobs {
    /// Creates or finds the policy's migration for the CRD as it is now, follows it to its
    /// end, and trims `storedVersions` if the built-in controller did not. A trim refused
    /// because the CRD's storage (or conversion) changed since the migration was created
    /// gets a new attempt, a bounded number of times.
    pub(super) async fn follow(
        &self,
        policy: &VersionPolicy,
        storage_version: &str,
        api: &builtin::Migrations,
        status: &mut MigrationStatus,
    ) -> Result<RunEnd, String> {
        let crd = &policy.spec.crd_name;
        let policy_name = policy.metadata.name.clone().unwrap_or_default();
        let settings = migrate::Settings {
            retry: self.retry.clone(),
            settle: self.settle.clone(),
            ..migrate::Settings::default()
        };
        for _ in 0..=MAX_RERUNS {
            let (migration, created_for, guard) = self
                .migration_for_now(policy, storage_version, api, &settings)
                .await?;
            status.storage_version_migration = Some(migration.name.clone());
            if let Some(created) = migration.created {
                status.started_at = Some(Time(created));
            }
            let followed = self.until_finished(&policy_name, &migration, api, status).await?;
            if let Followed::Deleted = followed {
                return Err(format!(
                    "StorageVersionMigration {} was deleted before Kubernetes started it (by this controller when the \
                     storage version moved on from {storage_version}: it would have rewritten into the new one \
                     unconfirmed; or by someone else); the next reconcile migrates into the storage version now",
                    migration.name
                ));
            }
            if let Followed::Failed = followed {
                // Kubernetes trims storedVersions as a failed migration ends: list again what
                // it listed when the migration was created. (Not yet ended, or not restored
                // now: every removal waits until it is, `removal_hold`.)
                if let Ok((read, _)) = api.get(&migration.name).await
                    && matches!(read.state, State::Failed(_))
                    && !read.running
                    && let Err(error) = self.restore_stored_versions(crd, &read, &created_for, api).await
                {
                    warn!(
                        crd,
                        error, "cannot restore status.storedVersions after a failed StorageVersionMigration"
                    );
                }
                return Ok(RunEnd::Failed);
            }
            // The built-in controller trims storedVersions on success; trim only if it did
            // not, relying on the CRD as the migration was created for it.
            let outcome = migrate::trim_after(
                &self.client,
                crd,
                &settings,
                &guard,
                &created_for.stored_versions,
                &created_for.conversion,
            )
            .await
            .map_err(|e| format!("StorageVersionMigration {} succeeded, but: {e}", migration.name))?;
            if let Some(end) = after_trim(crd, &migration.name, storage_version, outcome, status) {
                return Ok(end);
            }
        }
        Ok(RunEnd::Failed)
    }

    /// Polls the migration until it ends, reporting each state in `status.migration`. A
    /// migration still Pending (no condition: the svm controller has not picked it up)
    /// `svm_pending_deadline` after its creation, on the apiserver's clock, fails.
    async fn until_finished(
        &self,
        policy_name: &str,
        migration: &Migration,
        api: &builtin::Migrations,
        status: &mut MigrationStatus,
    ) -> Result<Followed, String> {
        let following_since = Instant::now();
        let mut state = migration.state.clone();
        let mut running = migration.running;
        let mut failed_since: Option<Instant> = None;
        let mut pending_for = None;
        let mut reported: Option<State> = None;
        loop {
            if reported.as_ref() != Some(&state) {
                status.message = Some(format!(
                    "StorageVersionMigration {} is {}",
                    migration.name,
                    describe(&state)
                ));
                self.write(policy_name, &MigratorJob::Migrate, status).await;
                reported = Some(state.clone());
            }
            match &state {
                State::Succeeded => return Ok(Followed::Succeeded),
                State::Failed(message) => {
                    status.message = Some(format!(
                        "StorageVersionMigration {} failed: {message}",
                        migration.name
                    ));
                    // Kubernetes trims storedVersions as it processes the end (`Running`
                    // turns False): wait a while for that, so that they can be restored.
                    let since = *failed_since.get_or_insert_with(Instant::now);
                    if !running || since.elapsed() >= FAILED_END_WAIT {
                        return Ok(Followed::Failed);
                    }
                }
                State::Pending => {
                    let waited = pending_for.unwrap_or_else(|| following_since.elapsed());
                    if waited >= self.svm_pending_deadline {
                        status.message = Some(format!(
                            "StorageVersionMigration {} has been Pending for {}s (deadline {}s): the kube-controller-manager's svm controller \
                             does not seem to run (it needs --controllers=*,svm and the StorageVersionMigrator feature gate); \
                             it is followed again once it runs",
                            migration.name,
                            waited.as_secs(),
                            self.svm_pending_deadline.as_secs()
                        ));
                        return Ok(Followed::Failed);
                    }
                }
                State::Running => {}
            }
            tokio::time::sleep(self.progress_interval).await;
            let (read, date) = match api.get(&migration.name).await {
                Ok(read) => read,
                Err(kube::Error::Api(status)) if status.code == 404 && state == State::Pending => {
                    return Ok(Followed::Deleted);
                }
                Err(error) => {
                    return Err(format!(
                        "cannot read StorageVersionMigration {}: {error}",
                        migration.name
                    ));
                }
            };
            state = read.state;
            running = read.running;
            pending_for = between(read.created, date);
        }
    }
}

/// How a run ends after the trim that followed a migration that succeeded (`None`: it was
/// not trimmed, and the next attempt follows).
fn after_trim(
    crd: &str,
    name: &str,
    storage_version: &str,
    outcome: Outcome,
    status: &mut MigrationStatus,
) -> Option<RunEnd> {
    // Kubernetes' migrator rewrote every object (settled before it was created).
    if let Outcome::Trimmed { .. } = outcome {
        status.rewrote_all = true;
    }
    match outcome {
        Outcome::Trimmed { previous } if previous.is_empty() => {
            status.message = Some(format!(
                "StorageVersionMigration {name} succeeded; status.storedVersions is [{storage_version}] (trimmed by the built-in migrator)"
            ));
            return Some(RunEnd::Succeeded);
        }
        Outcome::Trimmed { previous } => {
            status.message = Some(format!(
                "StorageVersionMigration {name} succeeded; status.storedVersions trimmed from [{}] to [{storage_version}]",
                previous.join(", ")
            ));
            return Some(RunEnd::Succeeded);
        }
        Outcome::NotTrimmed { reason } => {
            let message = format!(
                "StorageVersionMigration {name} succeeded, but status.storedVersions was not trimmed: {reason}"
            );
            warn!(crd, "{message}; migrating again");
            status.message = Some(message);
        }
        other => {
            status.message = Some(format!("unexpected outcome of the trim: {other:?}"));
            return Some(RunEnd::Error);
        }
    }
    None
}

/// A migration's state, as its status message says it.
fn describe(state: &State) -> String {
    match state {
        State::Pending => "waiting for the kube-controller-manager's svm controller".to_owned(),
        State::Running => "running".to_owned(),
        State::Succeeded => "complete".to_owned(),
        State::Failed(message) => format!("failed: {message}"),
    }
}
