//! What one reconcile found and did: the input from which the status is built. It borrows
//! the steps' results (`reconcile::apply::Applied`, `reconcile::background::Started`); only
//! the blocks, gathered from several steps, and the status as recorded are its own.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::{HistoryEntry, MilestoneKind, TrafficStatus};
use crate::controller::conditions::ConditionReason;
use crate::lifecycle::{CrdState, Evaluation, Transition};

/// What one reconcile found and did, for the status.
#[derive(Debug, Default)]
pub struct Observation<'a> {
    /// The CRD as it is after this reconcile (`None` when it does not exist).
    pub crd: Option<&'a CrdState>,
    /// The engine's decision, when the policy could be evaluated.
    pub evaluation: Option<&'a Evaluation>,
    /// Everything that holds the policy back, most important first.
    pub blocked: Vec<(ConditionReason, String)>,
    /// Transitions applied by this reconcile.
    pub applied: &'a [Transition],
    /// With `spec.dryRun`, the patch that was not applied.
    pub dry_run_patch: Option<&'a str>,
    /// Whether a storage-version migration of the CRD is running.
    pub migrating: bool,
    /// Whether a managedFields cleanup of the CRD is running.
    pub cleaning: bool,
    /// `status.history` as the apiserver has it now (read fresh, not from the cache, which
    /// may lag behind our own last write).
    pub recorded_history: Vec<HistoryEntry>,
    /// `status.conditions` as the apiserver has them now (`None`: the cache's).
    pub recorded_conditions: Option<Vec<Condition>>,
    /// Applied transitions that needed an approval, and who approved (field manager of
    /// the approval annotation) and when.
    pub approved: &'a [(String, MilestoneKind)],
    pub approver: Option<(String, Time)>,
    /// Traffic observed for versions with a traffic gate.
    pub traffic: &'a [TrafficStatus],
    /// Whether this reconcile pointed the CRD's spec.conversion at the webhook.
    pub conversion_configured: bool,
    /// Whether this reconcile gave the CRD back its conversion from before the webhook.
    pub conversion_restored: bool,
}
