//! One reconcile of a VersionPolicy: read the CRD, ask the engine, apply one guarded
//! patch, report status and events, and requeue at the next transition.

use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::core::{DeserializeGuard, error_boundary::InvalidObject};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use serde_json::json;
use tracing::{debug, info, warn};

use super::conditions::{ConditionReason, ConditionState, ConditionType, StatusReason};
use super::context::{Context, get_crd, get_crd_seen};
use super::decide::{Decision, WebhookConversion, cleaned_at_generation, decide, managed_fields_pending};
use super::error::{Error, Request, status_code};
use super::events::publish_events;
use super::gate_inputs;
use super::jobs::permissions::RECHECK_MISSING_AFTER;
use super::jobs::preflight;
use super::patch::as_json_patch;
use super::release::{ensure_finalizer, let_go, release};
use super::status::{Observation, apply_status, build_status, policy_state, recorded_status, write_status};
use crate::api::{FIELD_MANAGER, MigrationEngine, MilestoneKind, TrafficStatus, VersionPolicy};
use crate::lifecycle::{CrdState, Evaluation, Transition};
use crate::migrate::Mode;

/// How often a guarded patch is recomputed after the CRD changed under it, per reconcile.
const PATCH_ATTEMPTS: usize = 3;

/// Reconciles one policy (or reports one that cannot even be decoded).
pub async fn reconcile(
    object: Arc<DeserializeGuard<VersionPolicy>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let started = Instant::now();
    // Inside kube-runtime's span, which names the reason for this reconcile.
    tracing::debug!("reconcile started");
    let result = match &object.0 {
        Ok(policy) => reconcile_policy(policy, &ctx).await,
        Err(invalid) => report_undecodable(invalid, &ctx).await,
    };
    ctx.metrics.observe_reconcile(started.elapsed());
    result
}

/// Transient failures are retried soon; the trigger backoff of kube-runtime spaces out
/// watch failures.
pub fn error_policy(
    object: Arc<DeserializeGuard<VersionPolicy>>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let name = object
        .0
        .as_ref()
        .map_or_else(|i| i.metadata.name.clone(), |p| p.metadata.name.clone());
    let name = name.unwrap_or_default();
    match error {
        // The policy was deleted while it was being reconciled (its status write answers
        // 404): routine, and the next event says so.
        Error::Kube {
            request: Request::WriteStatus | Request::PatchPolicy,
            source: kube::Error::Api(status),
        } if status.code == 404 => {
            tracing::debug!(policy = name, error = %error, "policy gone during its reconcile");
        }
        _ => warn!(policy = name, error = %error, "reconcile failed"),
    }
    ctx.metrics.record_failure(error.label());
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile_policy(policy: &VersionPolicy, ctx: &Context) -> Result<Action, Error> {
    let name = policy.metadata.name.clone().ok_or(Error::MissingName)?;
    if policy.metadata.deletion_timestamp.is_some() {
        return release(policy, ctx).await;
    }
    ensure_finalizer(policy, ctx).await?;
    let now = ctx.now();
    let crd_name = policy.spec.crd_name.clone();
    let mut observation = Observation::default();
    let mut crd_after: Option<CrdState> = None;
    let mut evaluation: Option<Evaluation> = None;
    let mut drift = Vec::new();
    let mut missing_permissions: Vec<String> = Vec::new();
    // A block that only an outside change lifts (the built-in migrator's API enabled,
    // another migrator finishing): checked again soon.
    let mut unavailable_recheck = false;
    // When the next store's preflight is to start ahead of its instant.
    let mut preflight_wake: Option<Timestamp> = None;
    // When to look again at a writers gate's read under way.
    let mut writers_recheck: Option<Timestamp> = None;

    if let Some(owner) = competing_owner(policy, &ctx.policies) {
        observation.blocked.push((
            ConditionReason::Conflict,
            format!("VersionPolicy {owner} already governs {crd_name} (the oldest policy for a CRD wins)"),
        ));
    } else if policy.spec.suspend {
        observation.blocked.push((
            ConditionReason::Suspended,
            "spec.suspend is true: nothing is changed".to_owned(),
        ));
        let crd = get_crd(ctx, &crd_name).await?;
        if let Some(version) = crd.as_ref().and_then(|c| c.metadata.resource_version.as_deref()) {
            ctx.last_reconciles.record_crd(&name, version);
        }
        crd_after = crd.map(|crd| CrdState::from_crd(&crd));
    } else {
        // Kubernetes trims storedVersions as a failed StorageVersionMigration ends: what the
        // policy's own failed one had is listed again at once.
        if !policy.spec.dry_run {
            ctx.jobs.restore_after_failure(policy).await;
        }
        let on_the_way = ctx.patches_first.on_the_way();
        let outcome = apply(policy, ctx, now).await?;
        // Before anything else is awaited, so that the patch's own watch event, usually
        // right behind its answer, finds it recorded.
        if let Some(version) = &outcome.crd_resource_version {
            ctx.last_reconciles.record_crd(&name, version);
        }
        // A transition has landed once watchers see it (kubectl, GitOps tools): until this
        // process's own watch delivers the patch, this reconcile still counts as on its way,
        // and the bookkeeping of all waits.
        if outcome.patched
            && let Some(version) = &outcome.crd_resource_version
        {
            ctx.crds_seen
                .until_watched(&crd_name, version, super::patches_first::WATCH_DELIVERS_WITHIN)
                .await;
        }
        drop(on_the_way);
        // The CRD after this reconcile's own patch is etcd's: no read needed to confirm it.
        let patched = outcome.patched;
        crd_after = outcome.crd_after;
        evaluation = outcome.evaluation;
        writers_recheck = outcome.writers_recheck;
        // A removal held by a StorageVersionMigration waits on a change nothing watched
        // here announces.
        unavailable_recheck |= outcome.removal_held || outcome.store_held || outcome.failure_recheck;
        observation.blocked = outcome.blocked;
        observation.applied = outcome.applied;
        observation.dry_run_patch = outcome.dry_run_patch;
        observation.traffic = outcome.traffic;
        observation.conversion_configured = outcome.conversion_changed;
        observation.conversion_restored = outcome.conversion_restored;
        // Conversion preflights of the stores, ahead of their instants.
        if let Some(evaluation) = &evaluation {
            preflight_wake = preflight::schedule(
                policy,
                ctx,
                evaluation,
                crd_after.as_ref(),
                &outcome.fingerprints,
                now,
                &mut missing_permissions,
            )
            .await;
        }
        observation.approved = outcome.approved;
        observation.approver = gate_inputs::approver(policy);
        drift = outcome.drift;
        // Objects may still be stored in old versions (after a `store` transition, or
        // before a due `remove`): migrate them in the background. Decided on the CRD as it
        // is after the patch, whose storedVersions the apiserver has updated.
        if let Some(crd) = &crd_after
            && let Some(storage) = crd.storage_version()
            && crd.stores_other_versions()
            && policy.spec.migration.enabled
            && !policy.spec.dry_run
        {
            let engine = policy.spec.migration.engine;
            // Ours, under way with this engine: nothing to check again.
            let ours_under_way = ctx.jobs.running_migration(&crd_name).is_some_and(|running| {
                running.storage_version == storage
                    && running.builtin == (engine == MigrationEngine::StorageVersionMigration)
            });
            // Never two migrators at once: with the internal engine every unfinished
            // StorageVersionMigration counts (one this policy made under the other engine
            // too), with the built-in one those of others. Unknown (the API's discovery or
            // the list failed) holds ours too, until asked again.
            let foreign = match (ours_under_way, engine) {
                (true, _) => Ok(None),
                (false, MigrationEngine::Internal) => {
                    ctx.jobs.unfinished_migration(policy, false, Some(storage)).await
                }
                (false, MigrationEngine::StorageVersionMigration) => {
                    ctx.jobs.unfinished_migration(policy, true, Some(storage)).await
                }
            };
            if ours_under_way {
                observation.migrating = true;
            } else if let Err(why) = foreign {
                observation.blocked.push((
                    ConditionReason::AwaitingMigration,
                    format!(
                        "not migrating {crd_name} while it cannot be told whether another migrator runs ({why}); checking again shortly"
                    ),
                ));
                unavailable_recheck = true;
            } else if let Ok(Some(foreign)) = foreign {
                observation.blocked.push((
                    ConditionReason::AwaitingMigration,
                    format!(
                        "waiting for StorageVersionMigration {foreign} of {crd_name} to finish before migrating (only one migrator at a time)"
                    ),
                ));
                unavailable_recheck = true;
            } else if !patched && !stored_versions_untrimmed(ctx, &crd_name).await {
                // Decided on a kept copy the CRD watch has not caught up with: etcd's CRD is
                // trimmed already. Nothing to start (a run would find nothing to do, and its
                // end would reconcile on the same copy again, at once); the watch's event
                // reconciles.
                debug!(
                    crd = crd_name,
                    "status.storedVersions is trimmed already; no migration started"
                );
            } else {
                match engine {
                    MigrationEngine::Internal => {
                        match ctx.jobs.check_permissions(policy, Mode::Rewrite).await {
                            Ok(()) => observation.migrating = ctx.jobs.ensure(policy, storage),
                            Err(message) => missing_permissions.push(message),
                        }
                    }
                    MigrationEngine::StorageVersionMigration => match ctx.jobs.builtin_api().await {
                        Ok(Some(api)) => {
                            observation.migrating = ctx.jobs.ensure_builtin(policy, storage, api)
                        }
                        Ok(None) => {
                            observation.blocked.insert(
                                0,
                                (
                                    ConditionReason::StorageVersionMigrationUnavailable,
                                    crate::controller::jobs::BUILTIN_MIGRATION_ENABLE_HINT.to_owned(),
                                ),
                            );
                            unavailable_recheck = true;
                        }
                        Err(why) => {
                            observation.blocked.push((
                                ConditionReason::AwaitingMigration,
                                format!("not migrating {crd_name}: {why}; checking again shortly"),
                            ));
                            unavailable_recheck = true;
                        }
                    },
                }
            }
        }
        // A due removal waits until no object's managedFields names the version: rewrite
        // those entries in the background (after unserve, so that no client adds more).
        // It starts as soon as such a version is unserved, so that the removal lands on time.
        let awaiting = crd_after
            .as_ref()
            .map(|crd| cleanup_awaiting(policy, crd))
            .unwrap_or_default();
        // Confirmed on etcd's copy of the CRD, never on a kept copy alone: a cleanup decided
        // on a copy the watch has not caught up with (a version served again meanwhile)
        // ends at once, its end reconciles on the same copy, and the next starts at once.
        let fresh = if awaiting.is_empty() || policy.spec.dry_run {
            None
        } else if patched {
            crd_after.clone()
        } else {
            match get_crd(ctx, &crd_name).await {
                Ok(crd) => crd.map(|crd| CrdState::from_crd(&crd)),
                Err(error) => {
                    warn!(crd = crd_name, error = %error, "cannot read the CRD before starting a managedFields cleanup");
                    None
                }
            }
        };
        if let Some(crd) = &fresh
            && let awaiting = cleanup_awaiting(policy, crd)
            && !awaiting.is_empty()
            && let Some(storage) = crd.storage_version()
        {
            match ctx.jobs.check_permissions(policy, Mode::CleanManagedFields).await {
                Ok(()) => {
                    let gone = gone_to_record(policy, crd, &awaiting);
                    observation.cleaning =
                        ctx.jobs
                            .ensure_cleanup(policy, storage, awaiting, gone, crd.generation);
                }
                Err(message) => missing_permissions.push(message),
            }
        }
    }
    // A run that cannot start for lack of a grant: the most actionable block, first.
    missing_permissions.dedup();
    for message in missing_permissions.iter().rev() {
        observation
            .blocked
            .insert(0, (ConditionReason::MissingPermission, message.clone()));
    }
    observation.crd = crd_after.as_ref();
    observation.evaluation = evaluation.as_ref();

    // The other reconciles' patches first (many policies due at the same instant), but
    // never past this policy's own next transition: while this reconcile waits, the next one
    // of the policy cannot start.
    let next = evaluation
        .as_ref()
        .and_then(Evaluation::next_transition)
        .map(|t| t.at);
    let bookkeeping_waits = next.map_or(super::patches_first::BOOKKEEPING_WAITS_AT_MOST, |at| {
        Duration::try_from(at.duration_since(ctx.now()))
            .unwrap_or(Duration::ZERO)
            .min(super::patches_first::BOOKKEEPING_WAITS_AT_MOST)
    });
    ctx.patches_first.after_patches(bookkeeping_waits).await;
    publish_events(policy, &observation, &drift, &ctx.recorder).await;
    for transition in &observation.applied {
        ctx.metrics
            .record_transition(&crd_name, &transition.version, transition.milestone.as_str());
    }
    let reasons: Vec<&str> = observation.blocked.iter().map(|(r, _)| r.as_str()).collect();
    ctx.metrics.set_blocked(&name, &reasons);
    ctx.metrics.set_next_transition(&name, next);

    let cache_current = policy
        .metadata
        .resource_version
        .as_deref()
        .is_some_and(|version| ctx.last_reconciles.holds_own_status(&name, version));
    let (history, conditions) = recorded_status(&ctx.client, &name, policy, cache_current).await;
    observation.recorded_history = history;
    observation.recorded_conditions = Some(conditions);
    let status = build_status(policy, &observation, now);
    if let Some(version) = write_status(&ctx.client, &name, &status).await? {
        ctx.last_reconciles.record_status(&name, &version);
    }
    ctx.metrics.set_state(&name, Some(policy_state(&status)));
    // Wake at the next transition, or when a held one may proceed by time alone.
    let wake_at = evaluation.as_ref().and_then(|e| e.wake_at);
    // A missing grant is checked again soon (bounded backoff): granting it changes nothing
    // we watch. So is a wait on an outside change.
    let regrant = ctx
        .jobs
        .recheck_grant_after(&name, !missing_permissions.is_empty())
        .and_then(|delay| now.checked_add(delay).ok());
    let recheck = unavailable_recheck
        .then(|| now.checked_add(RECHECK_MISSING_AFTER).ok())
        .flatten();
    let wake = [next, wake_at, regrant, recheck, preflight_wake, writers_recheck]
        .into_iter()
        .flatten()
        .min();
    // kube-runtime counts the delay from the end of this reconcile, which may have taken
    // seconds on a loaded apiserver: measured from now, not from its start, so that the next
    // transition lands on its instant.
    Ok(Action::requeue(requeue_after(ctx.now(), wake, ctx.resync)))
}

/// How long to wait before the next reconcile: until the next transition (so that it lands
/// on time), at most `resync`.
pub fn requeue_after(now: Timestamp, next: Option<Timestamp>, resync: Duration) -> Duration {
    let Some(next) = next else { return resync };
    let until = next.duration_since(now);
    if until.is_negative() {
        return Duration::ZERO;
    }
    // Round up to the millisecond (and one more) so that the reconcile never runs just
    // before the instant.
    let millis = u64::try_from((until.as_nanos() + 999_999) / 1_000_000).unwrap_or(u64::MAX);
    Duration::from_millis(millis.saturating_add(1)).min(resync)
}

/// What [`apply`] found and did.
#[derive(Default)]
struct Applied {
    crd_after: Option<CrdState>,
    evaluation: Option<Evaluation>,
    blocked: Vec<(ConditionReason, String)>,
    applied: Vec<Transition>,
    dry_run_patch: Option<String>,
    drift: Vec<Transition>,
    traffic: Vec<TrafficStatus>,
    /// The milestones that needed an approval.
    approved: Vec<(String, MilestoneKind)>,
    /// Whether the patch pointed the CRD's spec.conversion at the webhook.
    conversion_changed: bool,
    /// Whether the patch gave the CRD back its conversion from before the webhook.
    conversion_restored: bool,
    /// Per version, what a preflight through it checks against (`preflight::fingerprints`),
    /// as the CRD is after the patch.
    fingerprints: std::collections::BTreeMap<String, String>,
    /// When to look again at a writers gate whose read is under way (or failed).
    writers_recheck: Option<Timestamp>,
    /// Whether a removal waits for a StorageVersionMigration (`BackgroundJobs::removal_hold`).
    removal_held: bool,
    /// Whether a store waits for a StorageVersionMigration (`GateInputs::migration_under_way`).
    store_held: bool,
    /// Whether the versions a failed StorageVersionMigration trimmed could not be listed
    /// again (`BackgroundJobs::list_again_after_failure_on_crd`): looked at again soon.
    failure_recheck: bool,
    /// The CRD's resourceVersion the decision was made on (after the patch, if any).
    crd_resource_version: Option<String>,
    /// Whether this reconcile patched the CRD (`crd_resource_version` is then the patch's).
    patched: bool,
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
        .filter(|c| c.phase == crate::api::MigrationPhase::Succeeded)
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

/// Whether etcd's copy of the CRD lists a version other than its storage version in
/// `status.storedVersions` (a quorum read, which refreshes the kept copy): a migration starts
/// only then, never on a kept copy alone. A read that fails starts nothing this time.
async fn stored_versions_untrimmed(ctx: &Context, crd_name: &str) -> bool {
    match get_crd(ctx, crd_name).await {
        Ok(crd) => crd.is_some_and(|crd| CrdState::from_crd(&crd).stores_other_versions()),
        Err(error) => {
            warn!(crd = crd_name, error = %error, "cannot read the CRD before starting a migration");
            false
        }
    }
}

/// Reads the CRD, evaluates the policy and applies the guarded patch, recomputing it when
/// the CRD changed concurrently.
async fn apply(policy: &VersionPolicy, ctx: &Context, now: Timestamp) -> Result<Applied, Error> {
    let crd_name = &policy.spec.crd_name;
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    for attempt in 0..PATCH_ATTEMPTS {
        let mut outcome = Applied::default();
        // The patch is guarded by the resourceVersion read: the first read may come from
        // the watch cache; after a refused patch, from etcd.
        let crd = if attempt == 0 {
            get_crd_seen(ctx, crd_name).await?
        } else {
            get_crd(ctx, crd_name).await?.map(Arc::new)
        };
        let Some(crd) = crd else {
            outcome.blocked.push((
                ConditionReason::CrdNotFound,
                format!("CustomResourceDefinition {crd_name} does not exist; waiting for it to be created"),
            ));
            return Ok(outcome);
        };
        outcome.fingerprints = preflight::fingerprints(&crd);
        outcome.crd_resource_version = crd.metadata.resource_version.clone();
        let mut gates = gate_inputs::gates(policy, &crd, &ctx.traffic);
        // Read in the background; a reconcile takes what is known and looks again while a
        // read is under way.
        let writers = gate_inputs::writers(&ctx.writers, policy, &crd, now);
        gates.inputs.writers = writers.writers;
        outcome.writers_recheck = writers.recheck_at;
        if !gates.invalid_approvals.is_empty() {
            warn!(policy = policy.name_any(), entries = ?gates.invalid_approvals, "ignoring approval entries that are not <version>.<milestone>");
        }
        let webhook = match (
            &ctx.webhook,
            policy.spec.conversion.as_ref().filter(|c| c.webhook.enabled),
        ) {
            (_, None) => WebhookConversion::NotWanted,
            (None, Some(_)) => WebhookConversion::NoWebhook,
            (Some(endpoint), Some(_)) => match endpoint.desired_conversion(&policy.name_any()) {
                Some(desired) => WebhookConversion::Desired(desired),
                None => WebhookConversion::CertificateNotReady,
            },
        };
        let mut decision = decide(policy, &crd, &gates.inputs, &webhook, now, None);
        let storage = crd
            .spec
            .versions
            .iter()
            .find(|v| v.storage)
            .map(|v| v.name.as_str());
        // A store about to land waits while a StorageVersionMigration of the resource is
        // unfinished (ours too, or while that cannot be told): the migration may start or go
        // on through an apiserver that still stores the version of before, and then trim it.
        if decision
            .pending
            .iter()
            .any(|t| t.milestone == MilestoneKind::Store)
        {
            // This controller's own built-in migration job counts from its first step: it
            // settles for seconds before it creates its StorageVersionMigration.
            let ours = ctx
                .jobs
                .running_migration(crd_name)
                .filter(|running| running.builtin);
            gates.inputs.migration_under_way = match ours {
                Some(running) => Some(running.awaited(crd_name)),
                None => match ctx.jobs.unfinished_migration(policy, false, storage).await {
                    Ok(None) => None,
                    Ok(Some(name)) => Some(format!("StorageVersionMigration {name} has finished")),
                    Err(reason) => Some(format!(
                        "it is known whether a StorageVersionMigration of it runs ({reason})"
                    )),
                },
            };
            if gates.inputs.migration_under_way.is_some() {
                outcome.store_held = true;
                decision = decide(policy, &crd, &gates.inputs, &webhook, now, None);
            }
        }
        // The CRD records that a StorageVersionMigration failed (and trimmed storedVersions):
        // unless a run of the policy covers it, every version is listed again now, whether a
        // removal is due or not (the failed migration may be gone by then), and a removal due
        // now waits for the migration that follows.
        let failure_uncovered = match crate::migrate::builtin::failure_on_crd(&crd) {
            Some(failure)
                if policy.spec.migration.enabled
                    && !policy.spec.dry_run
                    && ctx.jobs.running_migration(crd_name).is_none() =>
            {
                match ctx
                    .jobs
                    .list_again_after_failure_on_crd(policy, storage, &failure)
                    .await
                {
                    Ok(false) => None,
                    Ok(true) => Some(format!(
                        "a migration has rewritten every object of {crd_name} again (the CRD records a \
                         StorageVersionMigration that failed, which no migration of this policy has covered: \
                         {failure}; every version is listed in status.storedVersions again)"
                    )),
                    Err(error) => {
                        warn!(crd = crd_name, "{error}");
                        outcome.failure_recheck = true;
                        Some(format!(
                            "every version of {crd_name} is listed in status.storedVersions again after a \
                             StorageVersionMigration failed ({error})"
                        ))
                    }
                }
            }
            _ => None,
        };
        // A removal about to land waits while a StorageVersionMigration of the CRD holds it
        // (or while that cannot be told): Kubernetes' migrator can trim storedVersions
        // before it has rewritten the objects, as a migration starts and as a failed one ends.
        if decision
            .pending
            .iter()
            .any(|t| t.milestone == MilestoneKind::Remove)
        {
            // This controller's own migration of the CRD first: until it has finished (a
            // built-in job checks the storage guard after Kubernetes' migrator trimmed), a
            // trim may be ahead of its verdict.
            let ours = ctx.jobs.running_migration(crd_name);
            let unfinished = match (ours, failure_uncovered) {
                (Some(running), _) => Some(running.awaited(crd_name)),
                (None, Some(uncovered)) => Some(uncovered),
                (None, None) => match ctx.jobs.removal_hold(policy, storage, policy.spec.dry_run).await {
                    Ok(hold) => hold,
                    Err(reason) => Some(format!(
                        "it is known whether a StorageVersionMigration of it runs ({reason})"
                    )),
                },
            };
            if unfinished.is_some() {
                outcome.removal_held = true;
                decision = decide(policy, &crd, &gates.inputs, &webhook, now, unfinished);
            }
        }
        let Decision {
            state,
            evaluation,
            blocked,
            ops,
            pending,
            approved,
            conversion_changed,
            conversion_restored,
        } = decision;
        outcome.traffic = gates.traffic;
        outcome.blocked = blocked;
        outcome.approved = approved;
        outcome.conversion_changed = conversion_changed;
        outcome.conversion_restored = conversion_restored;
        let Some(evaluation) = evaluation else {
            outcome.crd_after = Some(state);
            return Ok(outcome);
        };
        if ops.is_empty() {
            outcome.crd_after = Some(state);
            outcome.evaluation = Some(evaluation);
            return Ok(outcome);
        }
        if policy.spec.dry_run {
            let text = serde_json::to_string(&ops).map_err(|source| Error::Serialize {
                what: "patch",
                source,
            })?;
            outcome.dry_run_patch = Some(text);
            outcome.crd_after = Some(state);
            outcome.evaluation = Some(evaluation);
            return Ok(outcome);
        }
        let patch = as_json_patch(&ops).map_err(|source| Error::Serialize {
            what: "patch",
            source,
        })?;
        let ticket = ctx.crds_seen.ticket();
        match api
            .patch(crd_name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(patched) => {
                let history = policy
                    .status
                    .as_ref()
                    .map(|s| s.history.as_slice())
                    .unwrap_or_default();
                outcome.drift = pending
                    .iter()
                    .filter(|t| {
                        history
                            .iter()
                            .any(|h| h.version == t.version && h.milestone == t.milestone)
                    })
                    .cloned()
                    .collect();
                outcome.applied = pending
                    .into_iter()
                    .filter(|t| !outcome.drift.contains(t))
                    .collect();
                outcome.crd_after = Some(CrdState::from_crd(&patched));
                outcome.fingerprints = preflight::fingerprints(&patched);
                outcome.crd_resource_version = patched.metadata.resource_version.clone();
                ctx.crds_seen.keep(&patched, ticket);
                outcome.patched = true;
                outcome.evaluation = Some(evaluation);
                info!(crd = crd_name, ops = ops.len(), "patched CRD");
                return Ok(outcome);
            }
            // 422 is what a failed `test` op answers (apiserver-samples/03), and also what a
            // real validation failure answers (04, 05): re-read to tell them apart. 404: the
            // CRD was deleted after the read (a kept copy the watch had not forgotten yet, as
            // when it went during a relist); the re-read forgets it and says CRDNotFound.
            Err(error) if matches!(status_code(&error), Some(404 | 409 | 422)) => {
                let fresh = get_crd(ctx, crd_name).await?;
                let changed = fresh.as_ref().map(|c| &c.metadata.resource_version)
                    != Some(&crd.metadata.resource_version);
                if changed {
                    info!(crd = crd_name, "CRD changed while patching; recomputing");
                    continue;
                }
                outcome.blocked.insert(
                    0,
                    (
                        ConditionReason::UnsafeState,
                        format!(
                            "the apiserver rejected the change to {crd_name}: {}",
                            api_message(&error)
                        ),
                    ),
                );
                outcome.crd_after = Some(state);
                outcome.evaluation = Some(evaluation);
                return Ok(outcome);
            }
            Err(error) => return Err(Error::of(Request::PatchCrd)(error)),
        }
    }
    Err(Error::ConcurrentModification {
        crd: crd_name.clone(),
        attempts: PATCH_ATTEMPTS,
    })
}

fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// The name of an older policy governing the same CRD, if there is one: the policy with
/// the earliest creationTimestamp (then name) keeps the CRD.
pub fn competing_owner(
    policy: &VersionPolicy,
    policies: &Store<DeserializeGuard<VersionPolicy>>,
) -> Option<String> {
    let key = |p: &VersionPolicy| (p.metadata.creation_timestamp.clone().map(|t| t.0), p.name_any());
    let mine = key(policy);
    policies
        .state()
        .iter()
        .filter_map(|guard| guard.0.as_ref().ok())
        .filter(|other| {
            other.spec.crd_name == policy.spec.crd_name
                && other.metadata.deletion_timestamp.is_none()
                && other.name_any() != policy.name_any()
        })
        .map(key)
        .filter(|other| *other < mine)
        .min()
        .map(|(_, name)| name)
}

/// A policy that does not decode (possible for objects stored before a schema change):
/// reported as invalid instead of breaking the watch for every policy.
async fn report_undecodable(invalid: &InvalidObject, ctx: &Context) -> Result<Action, Error> {
    let name = invalid.metadata.name.clone().ok_or(Error::MissingName)?;
    // Its spec cannot be read, so there is nothing to release: let a deletion proceed (a
    // conversion recorded on the CRD stays served from there).
    if invalid.metadata.deletion_timestamp.is_some() {
        let finalizers = invalid.metadata.finalizers.as_deref().unwrap_or_default();
        return let_go(ctx, &name, finalizers).await;
    }
    let now = ctx.now();
    let message = format!("the policy cannot be read: {}", invalid.error);
    let generation = invalid.metadata.generation;
    let conditions: Vec<_> = [
        ConditionState::new(
            ConditionType::Ready,
            false,
            ConditionReason::InvalidPolicy.as_str(),
            message.clone(),
        ),
        ConditionState::new(
            ConditionType::Reconciling,
            false,
            StatusReason::Stalled.as_str(),
            message.clone(),
        ),
        ConditionState::new(
            ConditionType::Stalled,
            true,
            ConditionReason::InvalidPolicy.as_str(),
            message.clone(),
        ),
        ConditionState::new(
            ConditionType::Blocked,
            true,
            ConditionReason::InvalidPolicy.as_str(),
            message,
        ),
    ]
    .into_iter()
    .map(|c| c.condition(&[], generation, now))
    .collect();
    let status = json!({"observedGeneration": generation, "conditions": conditions});
    apply_status(&ctx.client, &name, FIELD_MANAGER, status)
        .await
        .map_err(Error::of(Request::WriteStatus))?;
    ctx.metrics
        .set_blocked(&name, &[ConditionReason::InvalidPolicy.as_str()]);
    ctx.metrics.set_state(&name, Some("Stalled"));
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(text: &str) -> Timestamp {
        text.parse().expect("instant")
    }

    #[test]
    fn requeues_at_the_next_transition() {
        let resync = Duration::from_secs(600);
        let now = ts("2026-01-01T00:00:00Z");
        assert_eq!(
            requeue_after(now, Some(ts("2026-01-01T00:00:05Z")), resync),
            Duration::from_millis(5001)
        );
        assert_eq!(
            requeue_after(now, Some(ts("2026-01-01T00:00:00.2504Z")), resync),
            Duration::from_millis(252)
        );
    }

    #[test]
    fn requeue_is_capped_by_resync_and_never_negative() {
        let resync = Duration::from_secs(600);
        let now = ts("2026-01-01T00:00:00Z");
        assert_eq!(
            requeue_after(now, Some(ts("2026-03-01T00:00:00Z")), resync),
            resync
        );
        assert_eq!(requeue_after(now, None, resync), resync);
        assert_eq!(
            requeue_after(now, Some(ts("2025-12-31T23:59:59Z")), resync),
            Duration::ZERO
        );
    }
}
