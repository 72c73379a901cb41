//! The background step: what runs beyond the reconcile, started (or found running) on the
//! CRD as the apply step left it: the conversion preflights of the stores to come, the
//! migration of objects stored in other versions, and the managedFields cleanup before a
//! removal.

use jiff::Timestamp;
use tracing::{debug, warn};

use super::apply::Applied;
use super::decide::{cleaned_at_generation, managed_fields_pending};
use super::read;
use crate::api::{MigrationEngine, MigrationPhase, VersionPolicy};
use crate::controller::Context;
use crate::controller::conditions::ConditionReason;
use crate::controller::jobs::{self, preflight};
use crate::lifecycle::CrdState;
use crate::migrate::Mode;

/// What the background step started or found running, and what holds it.
#[derive(Debug, Default)]
pub struct Started {
    /// Whether a storage-version migration of the CRD is running.
    pub migrating: bool,
    /// Whether a managedFields cleanup of the CRD is running.
    pub cleaning: bool,
    /// Why the built-in migrator cannot be used: reported right after the missing grants,
    /// before the apply step's blocks.
    pub unavailable: Option<(ConditionReason, String)>,
    /// Why a migration waits for another migrator (or to learn whether one runs):
    /// reported after the decision's blocks.
    pub awaiting: Vec<(ConditionReason, String)>,
    /// The grants a run lacks (a message each, naming the ClusterRole that grants them),
    /// in the order the runs were asked.
    pub missing_permissions: Vec<String>,
    /// Whether it waits on an outside change nothing watched here announces (the
    /// built-in migrator's API enabled, another migrator finishing): looked at again soon.
    pub recheck_soon: bool,
    /// When the next store's preflight is to start ahead of its instant.
    pub preflight_wake: Option<Timestamp>,
}

/// Starts the background work `applied` calls for.
pub async fn start(policy: &VersionPolicy, ctx: &Context, applied: &Applied, now: Timestamp) -> Started {
    let mut started = Started::default();
    let crd_after = applied.crd();
    // Conversion preflights of the stores, ahead of their instants.
    if let Some(evaluation) = applied.evaluation() {
        started.preflight_wake = preflight::schedule(
            policy,
            ctx,
            evaluation,
            crd_after,
            &applied.fingerprints,
            now,
            &mut started.missing_permissions,
        )
        .await;
    }
    // Objects may still be stored in old versions (after a `store` transition, or
    // before a due `remove`): migrate them in the background. Decided on the CRD as it
    // is after the patch, whose storedVersions the apiserver has updated.
    if let Some(crd) = crd_after
        && let Some(storage) = crd.storage_version()
        && crd.stores_other_versions()
        && policy.spec.migration.enabled
        && !policy.spec.dry_run
    {
        start_migration(policy, ctx, storage, applied.patched(), &mut started).await;
    }
    // A due removal waits until no object's managedFields names the version: rewrite
    // those entries in the background (after unserve, so that no client adds more).
    // It starts as soon as such a version is unserved, so that the removal lands on time.
    if let Some(crd) = crd_after {
        start_cleanup(policy, ctx, crd, applied.patched(), &mut started).await;
    }
    started.missing_permissions.dedup();
    started
}

/// Starts migrating the CRD's objects into `storage` with the policy's engine, unless
/// ours runs already, another migrator runs (or that cannot be told), or etcd's CRD is
/// trimmed already.
async fn start_migration(
    policy: &VersionPolicy,
    ctx: &Context,
    storage: &str,
    patched: bool,
    started: &mut Started,
) {
    let crd_name = &policy.spec.crd_name;
    let engine = policy.spec.migration.engine;
    // Ours, under way with this engine: nothing to check again.
    let ours_under_way = ctx.jobs.running_migration(crd_name).is_some_and(|running| {
        running.storage_version == storage
            && running.builtin == (engine == MigrationEngine::StorageVersionMigration)
    });
    if ours_under_way {
        started.migrating = true;
        return;
    }
    // Never two migrators at once: with the internal engine every unfinished
    // StorageVersionMigration counts (one this policy made under the other engine
    // too), with the built-in one those of others. Unknown (the API's discovery or
    // the list failed) holds ours too, until asked again.
    let others_only = engine == MigrationEngine::StorageVersionMigration;
    match ctx
        .jobs
        .unfinished_migration(policy, others_only, Some(storage))
        .await
    {
        Err(why) => {
            started.awaiting.push((
                ConditionReason::AwaitingMigration,
                format!(
                    "not migrating {crd_name} while it cannot be told whether another migrator runs ({why}); checking again shortly"
                ),
            ));
            started.recheck_soon = true;
        }
        Ok(Some(foreign)) => {
            started.awaiting.push((
                ConditionReason::AwaitingMigration,
                format!(
                    "waiting for StorageVersionMigration {foreign} of {crd_name} to finish before migrating (only one migrator at a time)"
                ),
            ));
            started.recheck_soon = true;
        }
        Ok(None) if !patched && !stored_versions_untrimmed(ctx, crd_name).await => {
            // Decided on a kept copy the CRD watch has not caught up with: etcd's CRD is
            // trimmed already. Nothing to start (a run would find nothing to do, and its
            // end would reconcile on the same copy again, at once); the watch's event
            // reconciles.
            debug!(
                crd = crd_name,
                "status.storedVersions is trimmed already; no migration started"
            );
        }
        Ok(None) => start_with_engine(policy, ctx, storage, started).await,
    }
}

/// Starts the migration with the policy's engine: the internal migrator once its access
/// check passes, or a StorageVersionMigration where the API is served.
async fn start_with_engine(policy: &VersionPolicy, ctx: &Context, storage: &str, started: &mut Started) {
    match policy.spec.migration.engine {
        MigrationEngine::Internal => match ctx.jobs.check_permissions(policy, Mode::Rewrite).await {
            Ok(()) => started.migrating = ctx.jobs.ensure(policy, storage),
            Err(message) => started.missing_permissions.push(message),
        },
        MigrationEngine::StorageVersionMigration => match ctx.jobs.builtin_api().await {
            Ok(Some(api)) => started.migrating = ctx.jobs.ensure_builtin(policy, storage, api),
            Ok(None) => {
                started.unavailable = Some((
                    ConditionReason::StorageVersionMigrationUnavailable,
                    jobs::BUILTIN_MIGRATION_ENABLE_HINT.to_owned(),
                ));
                started.recheck_soon = true;
            }
            Err(why) => {
                started.awaiting.push((
                    ConditionReason::AwaitingMigration,
                    format!(
                        "not migrating {}: {why}; checking again shortly",
                        policy.spec.crd_name
                    ),
                ));
                started.recheck_soon = true;
            }
        },
    }
}

/// Whether etcd's copy of the CRD lists a version other than its storage version in
/// `status.storedVersions` (a quorum read, which refreshes the kept copy): a migration starts
/// only then, never on a kept copy alone. A read that fails starts nothing this time.
async fn stored_versions_untrimmed(ctx: &Context, crd_name: &str) -> bool {
    match read::from_etcd(ctx, crd_name).await {
        Ok(crd) => crd.is_some_and(|crd| CrdState::from_crd(&crd).stores_other_versions()),
        Err(error) => {
            warn!(crd = crd_name, error = %error, "cannot read the CRD before starting a migration");
            false
        }
    }
}

/// Starts the managedFields cleanup of the versions [`cleanup_awaiting`] names, confirmed
/// on etcd's copy of the CRD, never on a kept copy alone: a cleanup decided on a copy the
/// watch has not caught up with (a version served again meanwhile) ends at once, its end
/// reconciles on the same copy, and the next starts at once.
async fn start_cleanup(
    policy: &VersionPolicy,
    ctx: &Context,
    crd_after: &CrdState,
    patched: bool,
    started: &mut Started,
) {
    if cleanup_awaiting(policy, crd_after).is_empty() || policy.spec.dry_run {
        return;
    }
    let crd_name = &policy.spec.crd_name;
    // The CRD after this reconcile's own patch is etcd's already; else read it.
    let read = if patched {
        None
    } else {
        match read::from_etcd(ctx, crd_name).await {
            Ok(Some(crd)) => Some(CrdState::from_crd(&crd)),
            Ok(None) => return,
            Err(error) => {
                warn!(crd = crd_name, error = %error, "cannot read the CRD before starting a managedFields cleanup");
                return;
            }
        }
    };
    let fresh = read.as_ref().unwrap_or(crd_after);
    let awaiting = cleanup_awaiting(policy, fresh);
    let Some(storage) = fresh.storage_version() else {
        return;
    };
    if awaiting.is_empty() {
        return;
    }
    match ctx.jobs.check_permissions(policy, Mode::CleanManagedFields).await {
        Ok(()) => {
            let gone = gone_to_record(policy, fresh, &awaiting);
            started.cleaning = ctx
                .jobs
                .ensure_cleanup(policy, storage, awaiting, gone, fresh.generation);
        }
        Err(message) => started.missing_permissions.push(message),
    }
}

/// The versions whose managedFields entries a cleanup must rewrite now: those the policy
/// removes that are pending (`managed_fields_pending`) and unserved, and those the policy
/// removes that are gone from the CRD and no cleanup rewrote since they went
/// (`gone_cleaned`). An entry written through a version between its cleanup and its removal
/// (an HA apiserver that had not acted on the unserve yet, or a release that dropped a
/// version the policy was still serving) breaks server-side apply of its object for every
/// manager once the version is gone (apiserver-samples/29): one more cleanup after it went,
/// which waits until no apiserver serves it, repairs it; after that nothing can name it.
fn cleanup_awaiting(policy: &VersionPolicy, crd: &CrdState) -> Vec<String> {
    let scheduled_removals = policy
        .spec
        .versions
        .iter()
        .filter(|v| v.remove.is_some())
        .map(|v| v.name.as_str());
    let mut awaiting: Vec<String> = managed_fields_pending(policy, crd)
        .into_iter()
        .filter(|v| crd.version(v).is_some_and(|v| !v.served))
        .filter(|v| scheduled_removals.clone().any(|r| r == v))
        .collect();
    let cleaned = cleaned_at_generation(policy, crd);
    let gone_cleaned = gone_cleaned(policy);
    awaiting.extend(
        scheduled_removals
            .filter(|v| crd.version(v).is_none() && !cleaned.iter().any(|c| c == v))
            .filter(|v| !gone_cleaned.iter().any(|c| c == v))
            .map(str::to_owned),
    );
    awaiting
}

/// The versions the policy's last cleanup, which succeeded, rewrote while they were gone
/// from the CRD (at whatever generation: once gone and cleaned, nothing names them again).
fn gone_cleaned(policy: &VersionPolicy) -> Vec<String> {
    policy
        .status
        .as_ref()
        .and_then(|s| s.managed_fields_cleanup.as_ref())
        .filter(|c| c.phase == MigrationPhase::Succeeded)
        .map(|c| c.gone_versions.clone())
        .unwrap_or_default()
}

/// What a cleanup of `awaiting` records as cleaned while gone: those of them the CRD no
/// longer has, and those an earlier cleanup recorded that are still gone.
fn gone_to_record(policy: &VersionPolicy, crd: &CrdState, awaiting: &[String]) -> Vec<String> {
    let mut gone: Vec<String> = awaiting
        .iter()
        .chain(gone_cleaned(policy).iter())
        .filter(|v| crd.version(v).is_none())
        .cloned()
        .collect();
    gone.sort();
    gone.dedup();
    gone
}
