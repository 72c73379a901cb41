//! One reconcile of a VersionPolicy, in named steps, each in its own module with its own
//! error type (wrapped by [`Error`], whose labels keep the metrics apart):
//!
//! 1. [`release`]: a deleted policy releases its CRD and goes; a live one keeps the release
//!    finalizer.
//! 2. [`govern`]: whether the policy acts on its CRD (the oldest policy for a CRD governs;
//!    `spec.suspend` changes nothing).
//! 3. [`read`], [`inputs`] (with the pure [`decide`]) and [`apply`]: first, the versions a
//!    failed StorageVersionMigration of the policy trimmed are listed in storedVersions again
//!    (`BackgroundJobs::restore_after_failure`); then read the CRD, decide with the gates'
//!    inputs and the migrations' holds, send one guarded patch; when the CRD changed under
//!    the patch, again from etcd.
//! 4. [`background`]: start what runs beyond the reconcile (conversion preflights, the
//!    migration, the managedFields cleanup).
//! 5. [`report`]: Events, metrics and `status`.
//! 6. [`wake`]: when to reconcile again.
//!
//! A policy that does not decode is reported apart ([`undecodable`]).

pub mod apply;
pub mod background;
pub mod decide;
pub mod gates;
pub mod govern;
pub mod inputs;
pub mod read;
pub mod release;
pub mod report;
pub mod undecodable;
pub mod wake;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use tokio::time::Instant;
use tracing::{info, warn};

use super::conditions::ConditionReason;
use super::context::Context;
use super::error::Error;
use super::patches_first::WATCH_DELIVERS_WITHIN;
use crate::api::VersionPolicy;
use crate::lifecycle::{CrdState, Evaluation, Transition};
use apply::{Applied, ApplyError, Attempt, PatchOutcome};
use background::Started;
use govern::Governance;

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
        Err(invalid) => undecodable::report_undecodable(invalid, &ctx).await,
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
    if error.policy_gone() {
        // The policy was deleted while it was being reconciled (its status write answers
        // 404): routine, and the next event says so.
        tracing::debug!(policy = name, error = %error, "policy gone during its reconcile");
    } else {
        warn!(policy = name, error = %error, "reconcile failed");
    }
    ctx.metrics.record_failure(error.label());
    Action::requeue(Duration::from_secs(5))
}

/// The steps, for a policy that decodes.
async fn reconcile_policy(policy: &VersionPolicy, ctx: &Context) -> Result<Action, Error> {
    let name = policy.metadata.name.clone().ok_or(Error::MissingName)?;
    if policy.metadata.deletion_timestamp.is_some() {
        return Ok(release::release(policy, ctx).await?);
    }
    release::ensure_finalizer(policy, ctx).await?;
    let now = ctx.now();
    let crd_name = &policy.spec.crd_name;
    let reconciled = match govern::governance(policy, &ctx.policies) {
        Governance::Overruled { owner } => Reconciled::Held {
            blocked: (
                ConditionReason::Conflict,
                format!(
                    "VersionPolicy {owner} already governs {crd_name} (the oldest policy for a CRD wins)"
                ),
            ),
            crd: None,
        },
        Governance::Suspended => {
            let crd = read::from_etcd(ctx, crd_name).await?;
            if let Some(version) = crd.as_ref().and_then(|c| c.metadata.resource_version.as_deref()) {
                ctx.last_reconciles.record_crd(&name, version);
            }
            Reconciled::Held {
                blocked: (
                    ConditionReason::Suspended,
                    "spec.suspend is true: nothing is changed".to_owned(),
                ),
                crd: crd.map(|crd| CrdState::from_crd(&crd)),
            }
        }
        Governance::Acts => act(policy, ctx, &name, now).await?,
    };
    report::report(policy, ctx, &name, &reconciled, now).await?;
    let wake = wake::next_wake(ctx, &name, &reconciled, now);
    // kube-runtime counts the delay from the end of this reconcile, which may have taken
    // seconds on a loaded apiserver: measured from now, not from its start, so that the next
    // transition lands on its instant.
    Ok(Action::requeue(wake::requeue_after(ctx.now(), wake, ctx.resync)))
}

/// Read, decide, apply, and start the background work, for a policy that governs its CRD.
async fn act(policy: &VersionPolicy, ctx: &Context, name: &str, now: Timestamp) -> Result<Reconciled, Error> {
    // Kubernetes trims storedVersions as a failed StorageVersionMigration ends: what the
    // policy's own failed one had is listed again at once.
    if !policy.spec.dry_run {
        ctx.jobs.restore_after_failure(policy).await;
    }
    let on_the_way = ctx.patches_first.on_the_way();
    let applied = read_decide_apply(policy, ctx, now).await?;
    // Before anything else is awaited, so that the patch's own watch event, usually
    // right behind its answer, finds it recorded.
    if let Some(version) = &applied.resource_version {
        ctx.last_reconciles.record_crd(name, version);
    }
    // A transition has landed once watchers see it (kubectl, GitOps tools): until this
    // process's own watch delivers the patch, this reconcile still counts as on its way,
    // and the bookkeeping of all waits.
    if applied.patched()
        && let Some(version) = &applied.resource_version
    {
        ctx.crds_seen
            .until_watched(&policy.spec.crd_name, version, WATCH_DELIVERS_WITHIN)
            .await;
    }
    drop(on_the_way);
    let started = background::start(policy, ctx, &applied, now).await;
    Ok(Reconciled::Acted { applied, started })
}

/// The read, decide and apply steps, again from a read from etcd while the CRD changes
/// under the guarded patch (at most `PATCH_ATTEMPTS` times).
async fn read_decide_apply(
    policy: &VersionPolicy,
    ctx: &Context,
    now: Timestamp,
) -> Result<Box<Applied>, Error> {
    let crd_name = &policy.spec.crd_name;
    for attempt in 0..PATCH_ATTEMPTS {
        // The patch is guarded by the resourceVersion read: the first read may come from
        // the watch cache; after a refused patch, from etcd.
        let crd = if attempt == 0 {
            read::at_least_as_new_as_seen(ctx, crd_name).await?
        } else {
            read::from_etcd(ctx, crd_name).await?.map(Arc::new)
        };
        let Some(crd) = crd else {
            return Ok(Box::new(Applied::crd_not_found()));
        };
        let decided = inputs::decide_with_inputs(policy, ctx, &crd, now).await;
        match apply::apply(policy, ctx, &crd, decided).await? {
            Attempt::Done(applied) => return Ok(applied),
            Attempt::CrdChanged => info!(crd = crd_name, "CRD changed while patching; recomputing"),
        }
    }
    Err(ApplyError::ConcurrentModification {
        crd: crd_name.clone(),
        attempts: PATCH_ATTEMPTS,
    }
    .into())
}

/// What a reconcile of a live policy found and did: the input of the report and of the
/// next wake.
pub enum Reconciled {
    /// The policy does not act: another governs its CRD, or it is suspended (with the CRD
    /// as read then, if it exists).
    Held {
        blocked: (ConditionReason, String),
        crd: Option<CrdState>,
    },
    /// It read, decided and applied, and started the background work.
    Acted { applied: Box<Applied>, started: Started },
}

impl Reconciled {
    /// The CRD as it is after the reconcile.
    pub fn crd(&self) -> Option<&CrdState> {
        match self {
            Reconciled::Held { crd, .. } => crd.as_ref(),
            Reconciled::Acted { applied, .. } => applied.crd(),
        }
    }

    /// The engine's evaluation, when the policy could be evaluated.
    pub fn evaluation(&self) -> Option<&Evaluation> {
        match self {
            Reconciled::Held { .. } => None,
            Reconciled::Acted { applied, .. } => applied.evaluation(),
        }
    }

    /// Transitions the patch applied again because they had been undone.
    pub fn drift(&self) -> &[Transition] {
        match self {
            Reconciled::Acted { applied, .. } => match &applied.patch {
                PatchOutcome::Landed { drift, .. } => drift,
                _ => &[],
            },
            Reconciled::Held { .. } => &[],
        }
    }

    /// Whether a run could not start for lack of a grant.
    pub fn misses_permissions(&self) -> bool {
        matches!(self, Reconciled::Acted { started, .. } if !started.missing_permissions.is_empty())
    }

    /// Everything that holds the policy back, most important first: a missing grant (the
    /// most actionable), the built-in migrator unavailable, the apply step's blocks, then
    /// a migration waiting for another migrator.
    pub fn blocked(&self, crd_name: &str) -> Vec<(ConditionReason, String)> {
        match self {
            Reconciled::Held { blocked, .. } => vec![blocked.clone()],
            Reconciled::Acted { applied, started } => started
                .missing_permissions
                .iter()
                .map(|message| (ConditionReason::MissingPermission, message.clone()))
                .chain(started.unavailable.clone())
                .chain(applied.blocked(crd_name))
                .chain(started.awaiting.iter().cloned())
                .collect(),
        }
    }
}
