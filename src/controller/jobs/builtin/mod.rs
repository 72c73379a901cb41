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

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use tokio::time::Instant;
use tracing::{info, warn};

use super::job::Job;
use super::{BackgroundJobs, MAX_RERUNS, RunEnd};
use crate::api::{MigrationPhase, MigrationStatus, VersionPolicy};
use crate::migrate::builtin::{self, CreatedFor, Migration, State};
use crate::migrate::{self, GuardStart, Outcome, StorageGuard, Verdict};

/// How long a failed migration is followed until Kubernetes has processed its end (and
/// trimmed storedVersions), so that they can be restored at once.
const FAILED_END_WAIT: Duration = Duration::from_secs(60);

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
fn group_resource(crd: &str) -> (&str, &str) {
    crd.split_once('.')
        .map_or((crd, ""), |(plural, group)| (group, plural))
}

/// The apiserver's clock between two of its timestamps, in whole seconds (`None` if either
/// is unknown).
fn between(from: Option<Timestamp>, to: Option<Timestamp>) -> Option<Duration> {
    let seconds = to?.duration_since(from?).as_secs();
    Some(Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
}

/// How following one migration ended.
enum Followed {
    Succeeded,
    /// Failed, or never picked up (the reason is in the status message).
    Failed,
    /// Deleted before Kubernetes started it: the storage version moved on
    /// (`unfinished_migration`).
    Deleted,
}

/// Settles in a row a job of the built-in engine tries while the CRD keeps changing under
/// it, before the attempt fails (and the next one starts over).
const SETTLES_PER_ATTEMPT: u32 = 3;

impl BackgroundJobs {
    /// The built-in migrator's API at its newest served version, `None` when it is not
    /// served (asked at most once a minute, or every 5 s while it is not); `Err` when that
    /// cannot be told (asked again at the next call).
    pub async fn builtin_api(&self) -> Result<Option<builtin::Migrations>, String> {
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
    pub async fn unfinished_migration(
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
    pub async fn removal_hold(
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
            let ours = migration.policy.as_deref() == policy.metadata.name.as_deref();
            let hold = match (&migration.created_for, ours, dry_run) {
                (Some(created_for), true, false) => {
                    match self
                        .restore_stored_versions(crd, migration, created_for, &api)
                        .await
                    {
                        Ok(()) => continue,
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
                        continue;
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
            return Ok(Some(hold));
        }
        Ok(None)
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

    /// Lists every version the CRD has in its `status.storedVersions`, guarded by the
    /// resourceVersion just read, after a failed StorageVersionMigration that no migration
    /// since covers (`failure`: which one, or the CRD's record of it) trimmed it: whatever it
    /// trimmed is back, and the next migration rewrites every object. Adding a version the
    /// CRD has is always safe: at worst it asks for a migration that finds nothing to rewrite.
    async fn list_every_version(&self, crd: &str, failure: &str) -> Result<(), String> {
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

    /// What a run starting now covers (`MigrationStatus::covers_failed_migrations` and
    /// `covers_failed_migration_on_crd`), read before it lists its first object: the failed
    /// StorageVersionMigrations of the CRD's resource whose end Kubernetes has processed, and
    /// the CRD's own record of a failure. Nothing of what cannot be read: the run then
    /// covers less, which costs at most one more full run.
    pub(super) async fn processed_failures(&self, crd: &str) -> (Vec<String>, Option<String>) {
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
    pub async fn list_again_after_failure_on_crd(
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

    /// Restores what the policy's own failed StorageVersionMigration (named in
    /// `status.migration`) had in `storedVersions`, as soon as Kubernetes has processed its
    /// end, at every reconcile rather than only when a removal is due: a migration deleted
    /// meanwhile would take the knowledge with it. One GET, only while the status says the
    /// last migration failed.
    pub async fn restore_after_failure(&self, policy: &VersionPolicy) {
        let Some(name) = Job::Migrate
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

    /// Adds back to the CRD's `status.storedVersions` every version it listed when
    /// `migration` was created and still has, guarded by the resourceVersion just read, then
    /// marks the migration (`builtin::RESTORED_ANNOTATION`). Adding a version the CRD has is
    /// always safe: at worst it asks for a migration that finds nothing to rewrite.
    async fn restore_stored_versions(
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

    /// Creates or finds the policy's migration for the CRD as it is now, follows it to its
    /// end, and trims `storedVersions` if the built-in controller did not. A trim refused
    /// because the CRD's storage (or conversion) changed since the migration was created
    /// gets a new attempt, a bounded number of times.
    async fn follow(
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
            // Kubernetes' migrator rewrote every object (settled before it was created).
            if let Outcome::Trimmed { .. } = outcome {
                status.rewrote_all = true;
            }
            match outcome {
                Outcome::Trimmed { previous } if previous.is_empty() => {
                    status.message = Some(format!(
                        "StorageVersionMigration {} succeeded; status.storedVersions is [{storage_version}] (trimmed by the built-in migrator)",
                        migration.name
                    ));
                    return Ok(RunEnd::Succeeded);
                }
                Outcome::Trimmed { previous } => {
                    status.message = Some(format!(
                        "StorageVersionMigration {} succeeded; status.storedVersions trimmed from [{}] to [{storage_version}]",
                        migration.name,
                        previous.join(", ")
                    ));
                    return Ok(RunEnd::Succeeded);
                }
                Outcome::NotTrimmed { reason } => {
                    let message = format!(
                        "StorageVersionMigration {} succeeded, but status.storedVersions was not trimmed: {reason}",
                        migration.name
                    );
                    warn!(crd, "{message}; migrating again");
                    status.message = Some(message);
                }
                other => {
                    status.message = Some(format!("unexpected outcome of the trim: {other:?}"));
                    return Ok(RunEnd::Error);
                }
            }
        }
        Ok(RunEnd::Failed)
    }

    /// The policy's migration into `storage_version` that belongs to the CRD as it is now
    /// (with a storage guard from the state it was created for), or a new one.
    async fn migration_for_now(
        &self,
        policy: &VersionPolicy,
        storage_version: &str,
        api: &builtin::Migrations,
        settings: &migrate::Settings,
    ) -> Result<(Migration, CreatedFor, StorageGuard), String> {
        let crd = &policy.spec.crd_name;
        let policy_name = policy.metadata.name.clone().unwrap_or_default();
        let (group, resource) = group_resource(crd);
        let listed = api
            .of_resource(group, resource)
            .await
            .map_err(|e| format!("cannot list StorageVersionMigrations: {e}"))?;
        // What an earlier failed migration of ours had in storedVersions is listed again
        // before the CRD is read for the next one (Kubernetes trimmed it as that one ended):
        // the next attempt records it, and restores it if it fails too.
        for failed in listed.migrations.iter().filter(|m| {
            m.policy.as_deref() == Some(policy_name.as_str())
                && matches!(m.state, State::Failed(_))
                && !m.restored
        }) {
            if failed.running {
                return Err(format!(
                    "StorageVersionMigration {} failed and Kubernetes has not processed its end yet (which may trim \
                     status.storedVersions); the next attempt waits for it",
                    failed.name
                ));
            }
            if let Some(created_for) = &failed.created_for {
                self.restore_stored_versions(crd, failed, created_for, api)
                    .await?;
            }
        }
        // Settled before the migration is created, as the internal migrator settles before
        // its first rewrite: Kubernetes' migrator re-encodes each object through whichever
        // apiserver answers, and one that has not acted on the switch yet writes the old
        // version; the migration would still succeed and trim `storedVersions`.
        // The settle takes seconds: a CRD changed meanwhile (a storage version moved, or
        // moved and moved back, v2 -> v1 -> v2, by a GitOps self-heal) may not have reached
        // every apiserver either, so it is settled again (this controller's own patches,
        // which change no storage version, cost one more settle each).
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut settles = 0;
        let now = loop {
            let now = migrate::settled_target(&self.client, crd, settings)
                .await
                .map_err(|e| format!("cannot confirm the storage version of {crd}: {e}"))?;
            if now.storage_version != storage_version {
                return Err(format!(
                    "the storage version of {crd} is {}, not {storage_version}",
                    now.storage_version
                ));
            }
            let fresh = crds
                .get(crd)
                .await
                .map_err(|e| format!("cannot read {crd} before creating its StorageVersionMigration: {e}"))?;
            if fresh.metadata.generation == now.generation {
                break now;
            }
            settles += 1;
            if settles == SETTLES_PER_ATTEMPT {
                return Err(format!(
                    "{crd} changed while it settled, {SETTLES_PER_ATTEMPT} times in a row (generation {} -> {}); \
                     the next attempt settles again",
                    now.generation.unwrap_or_default(),
                    fresh.metadata.generation.unwrap_or_default()
                ));
            }
            info!(
                crd,
                "{crd} changed while it settled (generation {} -> {}); settling again",
                now.generation.unwrap_or_default(),
                fresh.metadata.generation.unwrap_or_default()
            );
        };
        // A failed migration no later one supersedes: one of ours that succeeded before it
        // ended cannot release its hold (`builtin::superseded`), the next attempt can.
        let uncovered = listed
            .migrations
            .iter()
            .find(|m| {
                matches!(m.state, State::Failed(_))
                    && !m.running
                    && m.holds_removals()
                    && !builtin::superseded(m, &listed.migrations)
            })
            .map(|m| m.name.clone());
        let ours: Vec<Migration> = listed
            .migrations
            .into_iter()
            .filter(|m| {
                m.policy.as_deref() == Some(policy_name.as_str())
                    && m.storage_version.as_deref() == Some(storage_version)
            })
            .collect();
        let guard_from = |created_for: &CreatedFor| {
            let start = GuardStart {
                resource_version: created_for.resource_version.clone(),
                generation: created_for.generation,
                storage_version: storage_version.to_owned(),
            };
            StorageGuard::start(&self.client, crd, start, settings.history_wait)
        };
        if let Some(last) = ours.last() {
            match (&last.state, &last.created_for) {
                // A failure not older than the retry wait stands (after a restart too), on
                // the apiserver's clock.
                (State::Failed(_), Some(created_for))
                    if between(last.changed, listed.at).is_some_and(|ago| ago < self.retry_after_failure) =>
                {
                    return Ok((last.clone(), created_for.clone(), guard_from(created_for)));
                }
                (State::Failed(_), _) => {}
                (State::Succeeded, _) if let Some(failed) = &uncovered => info!(
                    crd,
                    "StorageVersionMigration {} succeeded before StorageVersionMigration {failed} failed; creating the \
                     next attempt",
                    last.name
                ),
                (_, Some(created_for)) if created_for.conversion == now.conversion => {
                    let guard = guard_from(created_for);
                    if created_for.generation.is_some() && created_for.generation == now.generation {
                        return Ok((last.clone(), created_for.clone(), guard));
                    }
                    match guard.check(&now).await {
                        Verdict::Unchanged => return Ok((last.clone(), created_for.clone(), guard)),
                        Verdict::Changed(why) => info!(
                            crd,
                            "StorageVersionMigration {} belongs to an earlier state of the CRD ({why}); creating the next attempt",
                            last.name
                        ),
                    }
                }
                (_, Some(_)) => info!(
                    crd,
                    "StorageVersionMigration {} was created for another conversion of the CRD; creating the next attempt",
                    last.name
                ),
                (_, None) => info!(
                    crd,
                    "StorageVersionMigration {} does not record the state of the CRD it was created for; creating the next attempt",
                    last.name
                ),
            }
        }
        let created_for = CreatedFor {
            resource_version: now.resource_version.clone().unwrap_or_default(),
            generation: now.generation,
            stored_versions: now.stored_versions.clone(),
            conversion: now.conversion.clone(),
        };
        let attempt = u32::try_from(ours.len()).unwrap_or(u32::MAX).saturating_add(1);
        let name = builtin::migration_name(crd, storage_version, attempt);
        let created = api
            .create(
                &name,
                group,
                resource,
                &policy_name,
                storage_version,
                &created_for,
            )
            .await
            .map_err(|e| format!("cannot create StorageVersionMigration {name}: {e}"))?;
        let note = format!(
            "created StorageVersionMigration {name} ({}/{}) for {resource}.{group} into {storage_version}",
            builtin::GROUP,
            api.version
        );
        info!(crd, "{note}");
        self.event(
            &policy.object_ref(&()),
            EventType::Normal,
            "MigrationStarted",
            note,
        )
        .await;
        let guard = guard_from(&created_for);
        Ok((created, created_for, guard))
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
                    match &state {
                        State::Pending =>
                            "waiting for the kube-controller-manager's svm controller".to_owned(),
                        State::Running => "running".to_owned(),
                        State::Succeeded => "complete".to_owned(),
                        State::Failed(message) => format!("failed: {message}"),
                    }
                ));
                self.write(policy_name, &Job::Migrate, status).await;
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
    Job::Migrate.previous(policy).filter(|run| {
        run.phase == MigrationPhase::Succeeded
            && run.rewrote_all
            && Some(run.storage_version.as_str()) == storage_version
    })
}
