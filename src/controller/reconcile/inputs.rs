//! The decide step: what the decision needs beyond the CRD (the gates' inputs, the
//! conversion the webhook wants, the holds of the migrations on a store or a removal about
//! to land), and the decision itself ([`decide`](super::decide::decide), pure).

use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use tracing::warn;

use super::decide::{Decision, WebhookConversion, decide};
use super::gates;
use crate::api::{MilestoneKind, TrafficStatus, VersionPolicy};
use crate::controller::Context;

/// The decide step's result: the engine's decision on one read of the CRD, and what the
/// gates and the migrations' holds saw on the way.
#[derive(Debug)]
pub struct Decided {
    pub decision: Decision,
    /// Traffic observed for versions with a traffic gate (the status's `traffic`).
    pub traffic: Vec<TrafficStatus>,
    /// When to look again at a writers gate whose read is under way (or failed).
    pub writers_recheck: Option<Timestamp>,
    /// Whether a store waits for a StorageVersionMigration (`GateInputs::migration_under_way`).
    pub store_held: bool,
    /// Whether a removal waits for a StorageVersionMigration (`BackgroundJobs::removal_hold`).
    pub removal_held: bool,
    /// Whether the versions a failed StorageVersionMigration trimmed could not be listed
    /// again (`BackgroundJobs::list_again_after_failure_on_crd`): looked at again soon.
    pub failure_recheck: bool,
}

impl Decided {
    /// Whether it waits on a change nothing watched here announces (a migration finishing,
    /// a failed listing again): the reconcile looks again soon.
    pub fn waits_on_migrations(&self) -> bool {
        self.store_held || self.removal_held || self.failure_recheck
    }
}

/// Decides for `policy` on `crd` at `now`: with the gates' inputs, then again with the
/// holds of the StorageVersionMigrations when a store or a removal is about to land.
pub async fn decide_with_inputs(
    policy: &VersionPolicy,
    ctx: &Context,
    crd: &CustomResourceDefinition,
    now: Timestamp,
) -> Decided {
    let mut gates = gates::gates(policy, crd, &ctx.traffic);
    // Read in the background; a reconcile takes what is known and looks again while a
    // read is under way.
    let writers = gates::writers(&ctx.writers, policy, crd, now);
    gates.inputs.writers = writers.writers;
    if !gates.invalid_approvals.is_empty() {
        warn!(policy = policy.name_any(), entries = ?gates.invalid_approvals, "ignoring approval entries that are not <version>.<milestone>");
    }
    let webhook = webhook_conversion(policy, ctx);
    let mut decision = decide(policy, crd, &gates.inputs, &webhook, now, None);
    let storage = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.as_str());
    // A store about to land waits while a StorageVersionMigration of the resource is
    // unfinished (ours too, or while that cannot be told): the migration may start or go
    // on through an apiserver that still stores the version of before, and then trim it.
    let mut store_held = false;
    if is_pending(&decision, MilestoneKind::Store) {
        gates.inputs.migration_under_way = store_hold(policy, ctx, storage).await;
        if gates.inputs.migration_under_way.is_some() {
            store_held = true;
            decision = decide(policy, crd, &gates.inputs, &webhook, now, None);
        }
    }
    // The CRD records that a StorageVersionMigration failed (and trimmed storedVersions):
    // unless a run of the policy covers it, every version is listed again now, whether a
    // removal is due or not (the failed migration may be gone by then), and a removal due
    // now waits for the migration that follows.
    let mut failure_recheck = false;
    let failure_uncovered = failure_uncovered(policy, ctx, crd, storage, &mut failure_recheck).await;
    // A removal about to land waits while a StorageVersionMigration of the CRD holds it
    // (or while that cannot be told): Kubernetes' migrator can trim storedVersions
    // before it has rewritten the objects, as a migration starts and as a failed one ends.
    let mut removal_held = false;
    if is_pending(&decision, MilestoneKind::Remove) {
        let unfinished = removal_hold(policy, ctx, storage, failure_uncovered).await;
        if unfinished.is_some() {
            removal_held = true;
            decision = decide(policy, crd, &gates.inputs, &webhook, now, unfinished);
        }
    }
    Decided {
        decision,
        traffic: gates.traffic,
        writers_recheck: writers.recheck_at,
        store_held,
        removal_held,
        failure_recheck,
    }
}

fn is_pending(decision: &Decision, milestone: MilestoneKind) -> bool {
    decision.pending.iter().any(|t| t.milestone == milestone)
}

/// What the policy's `spec.conversion.webhook` asks of the CRD, given the webhook this
/// controller serves.
fn webhook_conversion(policy: &VersionPolicy, ctx: &Context) -> WebhookConversion {
    match (
        &ctx.webhook,
        policy.spec.conversion.as_ref().filter(|c| c.webhook.enabled),
    ) {
        (_, None) => WebhookConversion::NotWanted,
        (None, Some(_)) => WebhookConversion::NoWebhook,
        (Some(endpoint), Some(_)) => match endpoint.desired_conversion(&policy.name_any()) {
            Some(desired) => WebhookConversion::Desired(desired),
            None => WebhookConversion::CertificateNotReady,
        },
    }
}

/// What a store about to land waits for, if anything: this controller's own built-in
/// migration job counts from its first step (it settles for seconds before it creates its
/// StorageVersionMigration), then any unfinished StorageVersionMigration of the resource.
async fn store_hold(policy: &VersionPolicy, ctx: &Context, storage: Option<&str>) -> Option<String> {
    let crd_name = &policy.spec.crd_name;
    let ours = ctx
        .jobs
        .running_migration(crd_name)
        .filter(|running| running.builtin);
    match ours {
        Some(running) => Some(running.awaited(crd_name)),
        None => match ctx.jobs.unfinished_migration(policy, false, storage).await {
            Ok(None) => None,
            Ok(Some(name)) => Some(format!("StorageVersionMigration {name} has finished")),
            Err(reason) => Some(format!(
                "it is known whether a StorageVersionMigration of it runs ({reason})"
            )),
        },
    }
}

/// When the CRD records a StorageVersionMigration that failed and no run of the policy
/// covers it: lists every version in storedVersions again, and says what a removal waits
/// for. Sets `recheck` when that listing failed.
async fn failure_uncovered(
    policy: &VersionPolicy,
    ctx: &Context,
    crd: &CustomResourceDefinition,
    storage: Option<&str>,
    recheck: &mut bool,
) -> Option<String> {
    let crd_name = &policy.spec.crd_name;
    let failure = crate::migrate::builtin::failure_on_crd(crd)?;
    if !policy.spec.migration.enabled || policy.spec.dry_run || ctx.jobs.running_migration(crd_name).is_some()
    {
        return None;
    }
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
            *recheck = true;
            Some(format!(
                "every version of {crd_name} is listed in status.storedVersions again after a \
                 StorageVersionMigration failed ({error})"
            ))
        }
    }
}

/// What a removal about to land waits for, if anything: this controller's own migration of
/// the CRD first (until it has finished, a built-in job checks the storage guard after
/// Kubernetes' migrator trimmed, so a trim may be ahead of its verdict), then a failed
/// migration no run covers, then any StorageVersionMigration that holds it.
async fn removal_hold(
    policy: &VersionPolicy,
    ctx: &Context,
    storage: Option<&str>,
    failure_uncovered: Option<String>,
) -> Option<String> {
    let crd_name = &policy.spec.crd_name;
    let ours = ctx.jobs.running_migration(crd_name);
    match (ours, failure_uncovered) {
        (Some(running), _) => Some(running.awaited(crd_name)),
        (None, Some(uncovered)) => Some(uncovered),
        (None, None) => match ctx.jobs.removal_hold(policy, storage, policy.spec.dry_run).await {
            Ok(hold) => hold,
            Err(reason) => Some(format!(
                "it is known whether a StorageVersionMigration of it runs ({reason})"
            )),
        },
    }
}
