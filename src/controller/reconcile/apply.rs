//! The apply step: the decision's guarded JSON Patch sent to the CRD (or, with
//! `spec.dryRun`, shown), and what the CRD is after it.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use tracing::info;

use super::inputs::Decided;
use super::read::ReadError;
use super::{read, report::api_message};
use crate::api::VersionPolicy;
use crate::controller::Context;
use crate::controller::conditions::ConditionReason;
use crate::controller::jobs::preflight;
use crate::controller::patch::as_json_patch;
use crate::controller::request::status_code;
use crate::lifecycle::{CrdState, Evaluation, Transition};

/// The apply step failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The apiserver did not take the patch, for a reason other than the CRD's state.
    #[error("patching CustomResourceDefinition {crd} failed: {source}")]
    Patch {
        crd: String,
        #[source]
        source: kube::Error,
    },
    /// The read after a refused patch (to tell a changed CRD from an invalid patch) failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The CRD kept changing under us: every guarded patch attempt found it modified.
    #[error("CRD {crd} was modified concurrently {attempts} times in a row; will retry")]
    ConcurrentModification { crd: String, attempts: usize },
    /// The patch could not be serialized (a bug, reported rather than panicking).
    #[error("cannot serialize the patch: {0}")]
    Serialize(#[source] serde_json::Error),
}

/// What the read, decide and apply steps leave: what was decided, what the patch did, and
/// the CRD as it is after it.
#[derive(Debug)]
pub struct Applied {
    /// The decision; `None` when the CRD does not exist.
    pub decided: Option<Decided>,
    /// What became of the decision's patch.
    pub patch: PatchOutcome,
    /// The CRD's resourceVersion the decision was made on (after the patch, if any).
    pub resource_version: Option<String>,
    /// Per version, what a preflight through it checks against (`preflight::fingerprints`),
    /// as the CRD is after the patch.
    pub fingerprints: BTreeMap<String, String>,
}

/// What became of a decision's patch.
#[derive(Debug)]
pub enum PatchOutcome {
    /// Nothing to send: the CRD is as it must be, or the policy cannot be evaluated.
    NotNeeded,
    /// `spec.dryRun`: the patch that was not sent (JSON).
    DryRun(String),
    /// The patch landed: the CRD as etcd has it after it, the transitions it applied, and
    /// those it applied again because they had been undone (drift).
    Landed {
        crd: CrdState,
        applied: Vec<Transition>,
        drift: Vec<Transition>,
    },
    /// The apiserver refused the patch while the CRD was unchanged: its message.
    Refused(String),
}

/// One attempt at the apply step.
pub enum Attempt {
    /// Done, whatever became of the patch.
    Done(Box<Applied>),
    /// The CRD changed between the read and the patch: read, decide and apply again.
    CrdChanged,
}

impl Applied {
    /// The CRD does not exist: nothing decided.
    pub fn crd_not_found() -> Self {
        Applied {
            decided: None,
            patch: PatchOutcome::NotNeeded,
            resource_version: None,
            fingerprints: BTreeMap::new(),
        }
    }

    /// The CRD after this step: etcd's answer to the patch, or the copy decided on.
    pub fn crd(&self) -> Option<&CrdState> {
        match &self.patch {
            PatchOutcome::Landed { crd, .. } => Some(crd),
            _ => self.decided.as_ref().map(|d| &d.decision.state),
        }
    }

    /// The engine's evaluation, when the policy could be evaluated.
    pub fn evaluation(&self) -> Option<&Evaluation> {
        self.decided.as_ref()?.decision.evaluation.as_ref()
    }

    /// Whether this reconcile patched the CRD (`resource_version` is then the patch's).
    pub fn patched(&self) -> bool {
        matches!(self.patch, PatchOutcome::Landed { .. })
    }

    /// What holds the policy back, most important first: a refused patch, then the
    /// decision's blocks.
    pub fn blocked(&self, crd_name: &str) -> Vec<(ConditionReason, String)> {
        let Some(decided) = &self.decided else {
            return vec![(
                ConditionReason::CrdNotFound,
                format!("CustomResourceDefinition {crd_name} does not exist; waiting for it to be created"),
            )];
        };
        let refused = match &self.patch {
            PatchOutcome::Refused(message) => Some((
                ConditionReason::UnsafeState,
                format!("the apiserver rejected the change to {crd_name}: {message}"),
            )),
            _ => None,
        };
        refused
            .into_iter()
            .chain(decided.decision.blocked.iter().cloned())
            .collect()
    }
}

/// Applies `decided` to `crd` (as read): sends its guarded patch unless there is none or
/// `spec.dryRun` is set. A refused patch on a CRD that changed meanwhile asks for another
/// attempt; on an unchanged one, it is reported (`UnsafeState`).
pub async fn apply(
    policy: &VersionPolicy,
    ctx: &Context,
    crd: &CustomResourceDefinition,
    decided: Decided,
) -> Result<Attempt, ApplyError> {
    let crd_name = &policy.spec.crd_name;
    let done = |decided, patch| {
        Ok(Attempt::Done(Box::new(Applied {
            decided: Some(decided),
            patch,
            resource_version: crd.metadata.resource_version.clone(),
            fingerprints: preflight::fingerprints(crd),
        })))
    };
    let ops = &decided.decision.ops;
    if decided.decision.evaluation.is_none() || ops.is_empty() {
        return done(decided, PatchOutcome::NotNeeded);
    }
    if policy.spec.dry_run {
        let text = serde_json::to_string(ops).map_err(ApplyError::Serialize)?;
        return done(decided, PatchOutcome::DryRun(text));
    }
    let patch = as_json_patch(ops).map_err(ApplyError::Serialize)?;
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    let ticket = ctx.crds_seen.ticket();
    match api
        .patch(crd_name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(patched) => {
            ctx.crds_seen.keep(&patched, ticket);
            info!(crd = crd_name, ops = ops.len(), "patched CRD");
            let (applied, drift) = applied_and_drift(policy, &decided.decision.pending);
            Ok(Attempt::Done(Box::new(Applied {
                decided: Some(decided),
                patch: PatchOutcome::Landed {
                    crd: CrdState::from_crd(&patched),
                    applied,
                    drift,
                },
                resource_version: patched.metadata.resource_version.clone(),
                fingerprints: preflight::fingerprints(&patched),
            })))
        }
        // 422 is what a failed `test` op answers (apiserver-samples/03), and also what a
        // real validation failure answers (04, 05): re-read to tell them apart. 404: the
        // CRD was deleted after the read (a kept copy the watch had not forgotten yet, as
        // when it went during a relist); the re-read forgets it and says CRDNotFound.
        Err(error) if matches!(status_code(&error), Some(404 | 409 | 422)) => {
            let fresh = read::from_etcd(ctx, crd_name).await?;
            let changed =
                fresh.as_ref().map(|c| &c.metadata.resource_version) != Some(&crd.metadata.resource_version);
            if changed {
                return Ok(Attempt::CrdChanged);
            }
            done(decided, PatchOutcome::Refused(api_message(&error)))
        }
        Err(source) => Err(ApplyError::Patch {
            crd: crd_name.clone(),
            source,
        }),
    }
}

/// The transitions a landed patch applied: those the history already records were applied
/// before and undone since (drift), the others are new.
fn applied_and_drift(policy: &VersionPolicy, pending: &[Transition]) -> (Vec<Transition>, Vec<Transition>) {
    let history = policy
        .status
        .as_ref()
        .map(|s| s.history.as_slice())
        .unwrap_or_default();
    let drift: Vec<Transition> = pending
        .iter()
        .filter(|t| {
            history
                .iter()
                .any(|h| h.version == t.version && h.milestone == t.milestone)
        })
        .cloned()
        .collect();
    let applied = pending.iter().filter(|t| !drift.contains(t)).cloned().collect();
    (applied, drift)
}
