//! `spec.migration.engine: StorageVersionMigration`: the controller creates a
//! StorageVersionMigration for the CRD's group and resource where it would start its own
//! run, follows its conditions into `status.migration`, Events and metrics, and trims
//! `status.storedVersions` itself only if the built-in controller did not
//! (apiserver-samples/35). Whatever the engine, no run starts while another migrator's
//! StorageVersionMigration of the same resource is unfinished, or while that cannot be told.
//!
//! A migration is followed only if it was created for the CRD as it is now: its recorded
//! generation is the current one, or a storage guard watching the CRD from the state it was
//! created for saw the storage version unchanged since (the controller's own deprecation
//! moves the generation without making the migration stale). Anything else (a storage flip
//! since, a conversion change, a migration without the record) gets the next attempt. The
//! trim after it relies on what the CRD was when the migration was created, never on what
//! it is at the trim. Following holds no migration slot: polling costs the apiserver
//! nothing, and a migration the svm controller never picks up must not block other runs.

mod create;
mod follow;
mod holds;
mod stored_versions;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use tokio::time::Instant;
use tracing::warn;

use super::BackgroundJobs;
use super::end::RunEnd;
use super::goal::Goal;
use super::migrator_job::MigratorJob;
use crate::api::{MigrationStatus, VersionPolicy};
use crate::migrate::builtin;

/// How long the answer to "is the built-in migrator's API served?" stands: a yes for a
/// minute; a no only briefly, since a store or removal due waits on any migration of the
/// resource, and the API may just have been enabled (a burst of policies due at one
/// instant still asks once).
const API_ANSWER_STANDS_FOR: Duration = Duration::from_secs(60);
const API_ABSENT_STANDS_FOR: Duration = Duration::from_secs(5);

/// How to enable the API, for the Blocked message.
pub const ENABLE_HINT: &str = "the apiserver does not serve storagemigration.k8s.io (StorageVersionMigration, beta and off by default in Kubernetes 1.35-1.36): \
     enable the StorageVersionMigrator feature gate and --runtime-config=storagemigration.k8s.io/v1beta1=true on the apiserver, \
     and the svm controller on the kube-controller-manager (--controllers=*,svm), or set spec.migration.engine: Internal";

/// The group and resource of a CRD named `<plural>.<group>`.
pub(super) fn group_resource(crd: &str) -> (&str, &str) {
    crd.split_once('.')
        .map_or((crd, ""), |(plural, group)| (group, plural))
}

/// The apiserver's clock between two of its timestamps, in whole seconds (`None` if either
/// is unknown).
pub(super) fn between(from: Option<Timestamp>, to: Option<Timestamp>) -> Option<Duration> {
    let seconds = to?.duration_since(from?).as_secs();
    Some(Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
}

impl BackgroundJobs {
    /// The built-in migrator's API at its newest served version, `None` when it is not
    /// served (asked at most once a minute, or every 5 s while it is not); `Err` when that
    /// cannot be told (asked again at the next call).
    pub(crate) async fn builtin_api(&self) -> Result<Option<builtin::Migrations>, String> {
        // Held across the discovery: a burst of reconciles due at one instant asks once.
        let mut cached = self.builtin_api.lock().await;
        if let Some((at, api)) = cached.as_ref()
            && at.elapsed()
                < if api.is_some() {
                    API_ANSWER_STANDS_FOR
                } else {
                    API_ABSENT_STANDS_FOR
                }
        {
            return Ok(api.clone());
        }
        let api = builtin::Migrations::discover(&self.client)
            .await
            .map_err(|error| {
                warn!(error = %error, "cannot tell whether storagemigration.k8s.io is served");
                format!("cannot tell whether storagemigration.k8s.io is served: {error}")
            })?;
        *cached = Some((Instant::now(), api.clone()));
        Ok(api)
    }

    /// Starts (or follows) the built-in migration of the policy's CRD into
    /// `storage_version`, unless one is followed already or the last one failed recently.
    /// Shares its key with the internal migration: one migration per CRD, whatever the
    /// engine. Returns whether one is under way now.
    pub(crate) fn ensure_builtin(
        self: &Arc<Self>,
        policy: &VersionPolicy,
        storage_version: &str,
        api: builtin::Migrations,
    ) -> bool {
        let goal = Goal::FollowBuiltin {
            storage: storage_version.to_owned(),
        };
        let held = self.failed_recently(&MigratorJob::Migrate, policy, storage_version);
        let this = self.clone();
        let crd = policy.spec.crd_name.clone();
        let policy = policy.clone();
        let storage = storage_version.to_owned();
        self.launch(&crd, goal, held, async move {
            this.run_builtin(policy, storage, api).await
        })
    }

    /// Follows the built-in migration without a migration slot: the built-in controller
    /// does the work, and its own queue paces it.
    async fn run_builtin(
        self: Arc<Self>,
        policy: VersionPolicy,
        storage_version: String,
        api: builtin::Migrations,
    ) {
        let crd = policy.spec.crd_name.clone();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let reference = policy.object_ref(&());
        let job = MigratorJob::Migrate;
        self.initialize_counters(&job, &crd);
        let started = Instant::now();
        let mut status = MigrationStatus::running(&storage_version, Time(self.now()));
        let end = match self.follow(&policy, &storage_version, &api, &mut status).await {
            Ok(end) => end,
            Err(message) => {
                status.message = Some(message);
                RunEnd::Error
            }
        };
        self.metrics
            .migration_duration
            .observe(started.elapsed().as_secs_f64());
        self.conclude(&name, &reference, &job, &crd, status, end).await;
    }
}
