//! `spec.migration.engine: StorageVersionMigration`: the controller creates a
//! StorageVersionMigration for the CRD's group and resource where it would start its own
//! run, follows its conditions into `status.migration`, Events and metrics, and trims
//! `status.storedVersions` itself only if the built-in controller did not
//! (apiserver-samples/35). Whatever the engine, no run starts while another migrator's
//! StorageVersionMigration of the same resource is unfinished.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::runtime::events::EventType;
use tokio::time::Instant;
use tracing::{info, warn};

use super::job::Job;
use super::{Migrations, RunEnd};
use crate::api::{MigrationStatus, VersionPolicy};
use crate::migrate::builtin::{self, Migration, State};
use crate::migrate::{self, Outcome};
use crate::sync::lock;

/// How long the answer to "is the built-in migrator's API served?" stands.
const API_ANSWER_STANDS_FOR: Duration = Duration::from_secs(60);

/// How to enable the API, for the Blocked message.
pub const ENABLE_HINT: &str = "the apiserver does not serve storagemigration.k8s.io (StorageVersionMigration, beta and off by default in Kubernetes 1.35-1.36): \
     enable the StorageVersionMigrator feature gate and --runtime-config=storagemigration.k8s.io/v1beta1=true on the apiserver, \
     and the svm controller on the kube-controller-manager (--controllers=*,svm), or set spec.migration.engine: Internal";

/// The group and resource of a CRD named `<plural>.<group>`.
fn group_resource(crd: &str) -> (&str, &str) {
    crd.split_once('.')
        .map_or((crd, ""), |(plural, group)| (group, plural))
}

impl Migrations {
    /// The built-in migrator's API at its newest served version, `None` when it is not
    /// served (asked at most once a minute).
    pub async fn builtin_api(&self) -> Option<builtin::Migrations> {
        if let Some((at, api)) = lock(&self.builtin_api).as_ref()
            && at.elapsed() < API_ANSWER_STANDS_FOR
        {
            return api.clone();
        }
        let api = match builtin::Migrations::discover(&self.client).await {
            Ok(api) => api,
            Err(error) => {
                warn!(error = %error, "cannot tell whether storagemigration.k8s.io is served");
                None
            }
        };
        *lock(&self.builtin_api) = Some((Instant::now(), api.clone()));
        api
    }

    /// An unfinished StorageVersionMigration of the policy's CRD (not counting this
    /// policy's own when `except_ours`): while one runs, no migration of ours starts.
    pub async fn unfinished_migration(&self, policy: &VersionPolicy, except_ours: bool) -> Option<String> {
        let api = self.builtin_api().await?;
        let (group, resource) = group_resource(&policy.spec.crd_name);
        let name = policy.metadata.name.as_deref();
        match api.of_resource(group, resource).await {
            Ok(migrations) => migrations
                .into_iter()
                .filter(|m| !(except_ours && m.policy.as_deref() == name))
                .find(|m| !m.state.is_finished())
                .map(|m| m.name),
            Err(error) => {
                warn!(crd = policy.spec.crd_name, error = %error, "cannot list StorageVersionMigrations");
                None
            }
        }
    }

    /// Starts (or follows) the built-in migration of the policy's CRD into
    /// `storage_version`, unless one is followed already or the last one failed recently.
    /// Shares its key with the internal migration: one migration per CRD, whatever the
    /// engine. Returns whether one is under way now.
    pub fn ensure_builtin(
        self: &Arc<Self>,
        policy: &VersionPolicy,
        storage_version: &str,
        api: builtin::Migrations,
    ) -> bool {
        let key = Job::Migrate.key(&policy.spec.crd_name);
        let goal = format!("builtin {storage_version}");
        let held = self.failed_recently(&Job::Migrate, policy, storage_version);
        let this = self.clone();
        let policy = policy.clone();
        let storage = storage_version.to_owned();
        self.launch(key, goal, held, async move {
            this.run_builtin(policy, storage, api).await
        })
    }

    async fn run_builtin(
        self: Arc<Self>,
        policy: VersionPolicy,
        storage_version: String,
        api: builtin::Migrations,
    ) {
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let crd = policy.spec.crd_name.clone();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let reference = policy.object_ref(&());
        let job = Job::Migrate;
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

    /// Creates or finds the policy's migration, follows it to its end, and trims
    /// `storedVersions` if the built-in controller did not.
    async fn follow(
        &self,
        policy: &VersionPolicy,
        storage_version: &str,
        api: &builtin::Migrations,
        status: &mut MigrationStatus,
    ) -> Result<RunEnd, String> {
        let crd = &policy.spec.crd_name;
        let policy_name = policy.metadata.name.clone().unwrap_or_default();
        let reference = policy.object_ref(&());
        let (group, resource) = group_resource(crd);
        let ours: Vec<Migration> = api
            .of_resource(group, resource)
            .await
            .map_err(|e| format!("cannot list StorageVersionMigrations: {e}"))?
            .into_iter()
            .filter(|m| {
                m.policy.as_deref() == Some(policy_name.as_str())
                    && m.storage_version.as_deref() == Some(storage_version)
            })
            .collect();
        let last = ours.last().cloned();
        let migration = match last {
            // A failure not older than the retry wait stands (after a restart too).
            Some(m)
                if matches!(m.state, State::Failed(_))
                    && m.changed.is_some_and(|at| {
                        Timestamp::now().duration_since(at).as_secs()
                            < i64::try_from(self.retry_after_failure.as_secs()).unwrap_or(i64::MAX)
                    }) =>
            {
                m
            }
            Some(m) if !matches!(m.state, State::Failed(_)) => m,
            _ => {
                let attempt = u32::try_from(ours.len()).unwrap_or(u32::MAX).saturating_add(1);
                let name = builtin::migration_name(crd, storage_version, attempt);
                let created = api
                    .create(&name, group, resource, &policy_name, storage_version)
                    .await
                    .map_err(|e| format!("cannot create StorageVersionMigration {name}: {e}"))?;
                let note = format!(
                    "created StorageVersionMigration {name} ({}/{}) for {resource}.{group} into {storage_version}",
                    builtin::GROUP,
                    api.version
                );
                info!(crd, "{note}");
                self.event(&reference, EventType::Normal, "MigrationStarted", note)
                    .await;
                created
            }
        };
        status.storage_version_migration = Some(migration.name.clone());
        if let Some(created) = migration.created {
            status.started_at = Some(Time(created));
        }
        let mut state = migration.state.clone();
        let mut reported: Option<State> = None;
        loop {
            if reported.as_ref() != Some(&state) {
                status.message = Some(format!(
                    "StorageVersionMigration {} is {}",
                    migration.name,
                    match &state {
                        State::Pending =>
                            "waiting for the kube-controller-manager's svm controller".to_owned(),
                        State::Running => "running".to_owned(),
                        State::Succeeded => "complete".to_owned(),
                        State::Failed(message) => format!("failed: {message}"),
                    }
                ));
                self.write(&policy_name, &Job::Migrate, status).await;
                reported = Some(state.clone());
            }
            match &state {
                State::Succeeded => break,
                State::Failed(message) => {
                    status.message = Some(format!(
                        "StorageVersionMigration {} failed: {message}",
                        migration.name
                    ));
                    return Ok(RunEnd::Failed);
                }
                State::Pending | State::Running => {}
            }
            tokio::time::sleep(self.progress_interval).await;
            state = api
                .get(&migration.name)
                .await
                .map_err(|e| format!("cannot read StorageVersionMigration {}: {e}", migration.name))?
                .state;
        }
        // The built-in controller trims storedVersions on success; trim only if it did not.
        let settings = migrate::Settings {
            retry: self.retry.clone(),
            settle: self.settle.clone(),
            ..migrate::Settings::default()
        };
        let outcome = migrate::trim_after(&self.client, crd, &settings)
            .await
            .map_err(|e| format!("StorageVersionMigration {} succeeded, but: {e}", migration.name))?;
        Ok(match outcome {
            Outcome::Trimmed { previous } if previous.is_empty() => {
                status.message = Some(format!(
                    "StorageVersionMigration {} succeeded; status.storedVersions is [{storage_version}] (trimmed by the built-in migrator)",
                    migration.name
                ));
                RunEnd::Succeeded
            }
            Outcome::Trimmed { previous } => {
                status.message = Some(format!(
                    "StorageVersionMigration {} succeeded; status.storedVersions trimmed from [{}] to [{storage_version}]",
                    migration.name,
                    previous.join(", ")
                ));
                RunEnd::Succeeded
            }
            Outcome::NotTrimmed { reason } => {
                status.message = Some(format!(
                    "StorageVersionMigration {} succeeded, but status.storedVersions was not trimmed: {reason}",
                    migration.name
                ));
                RunEnd::Failed
            }
            other => {
                status.message = Some(format!("unexpected outcome of the trim: {other:?}"));
                RunEnd::Error
            }
        })
    }
}
