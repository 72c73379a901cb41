//! Conversion preflights: before a `store`, every object is read through the version it
//! switches to (nothing written); the result goes to that version's entry of
//! `status.preflights` and gates the store.
//!
//! A preflight runs ahead of its store's instant, by the policy's `preflightLead` or by a
//! lead derived from the CRD's object count and the rate the last preflight read at. Its
//! result is for that store only, and only while what the objects were checked against (the
//! CRD's conversion, storage version and schemas: [`fingerprint`]) is unchanged. Shortly
//! before the instant the objects are listed again (names and resourceVersions), and those
//! created or changed since the preflight read them are read, converted and checked the same
//! way. At the instant a result stands only if it finished, or was checked, that recently
//! (`lifecycle::PreflightPass::stands`); otherwise the store waits for the check.
//!
//! Every decision here is read from the policy's status, so that a restarted controller or a
//! new leader decides the same. Only the set of objects a preflight read is kept in memory
//! (`remembered`: 16 bytes per object, more than a status could hold; one
//! set per store to come whose preflight ran, dropped when it lands): a controller without it
//! compares the objects' digest instead, and reads every object again if they changed.

mod plan;
mod remembered;
mod run;
mod verify;

pub use plan::fingerprints;
pub(crate) use plan::{pass, recorded};
pub(super) use remembered::RememberedObjects;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use crate::api::{MilestoneKind, VersionPolicy, VersionPolicyStatus};
use crate::controller::context::Context;
use crate::lifecycle::{BlockReason, CrdState, Evaluation, Transition};
use crate::migrate::Mode;
use plan::{MAX_PREFLIGHT_LEAD, PreflightNeed, StorePreflight, measured_rate, preflight_lead};

/// Starts, checks and schedules the conversion preflights of a policy's stores: a due store
/// held for its preflight runs it now; an upcoming one runs it ahead of its instant (by the
/// policy's `preflightLead`, or a lead derived from the object count and the rate the last
/// preflight read at), once its version is served; a passed one is checked shortly before the
/// instant, or at once when a due store waits for that check. `fingerprints`: the CRD's
/// [`fingerprints`]. Returns when to wake for the next start or check; a missing grant goes
/// to `missing_permissions`.
pub(crate) async fn schedule(
    policy: &VersionPolicy,
    ctx: &Context,
    evaluation: &Evaluation,
    crd: Option<&CrdState>,
    fingerprints: &BTreeMap<String, String>,
    now: Timestamp,
    missing_permissions: &mut Vec<String>,
) -> Option<Timestamp> {
    if !(policy.spec.migration.enabled && policy.spec.migration.preflight) {
        return None;
    }
    let version = |name: &str| crd.and_then(|c| c.version(name));
    let stores = stores_to_prepare(evaluation, crd, now);
    // What this controller remembers of the objects preflights read: only for stores to come.
    let upcoming: Vec<&str> = stores.iter().map(|s| s.version.as_str()).collect();
    ctx.jobs.forget_checked_objects(&policy.spec.crd_name, &upcoming);
    let status = policy.status.as_ref();
    let configured = configured_lead(policy);
    let rate = newest_rate(status);
    let mut wake: Option<Timestamp> = None;
    for store in stores {
        let Some(fingerprint) = fingerprints.get(&store.version) else {
            continue;
        };
        let recorded = recorded(status, &store.version);
        let (lead, counted) = lead_for(ctx, policy, store, configured, rate, now).await;
        let plan = StorePreflight {
            version: store.version.clone(),
            store_at: store.at,
            fingerprint: fingerprint.clone(),
            lead,
            objects: counted.max(recorded.map(|p| p.read)).unwrap_or(0),
            retry_wait: ctx.jobs.retry_after_failure,
        };
        match plan.need(recorded, now) {
            PreflightNeed::Run(_) if version(&store.version).is_some_and(|v| v.served) => {
                match ctx.jobs.check_permissions(policy, Mode::Preflight).await {
                    Ok(()) => ctx.jobs.ensure_preflight(policy, plan.clone()),
                    Err(message) => missing_permissions.push(message),
                }
            }
            PreflightNeed::Verify => ctx.jobs.verify_preflight(policy, plan.clone()),
            _ => {}
        }
        wake = [wake, plan.wake(recorded, now)].into_iter().flatten().min();
    }
    wake
}

/// The stores a preflight is for: those still to come (not done by hand already), and due
/// ones held for it.
fn stores_to_prepare<'a>(
    evaluation: &'a Evaluation,
    crd: Option<&CrdState>,
    now: Timestamp,
) -> Vec<&'a Transition> {
    let held: Vec<&str> = evaluation
        .blocked
        .iter()
        .filter(|b| {
            b.milestone == Some(MilestoneKind::Store)
                && matches!(
                    b.reason,
                    BlockReason::AwaitingPreflight | BlockReason::ConversionPreflightFailed
                )
        })
        .map(|b| b.version.as_str())
        .collect();
    let version = |name: &str| crd.and_then(|c| c.version(name));
    // Stores still to come (not done by hand already) and due ones held for it.
    evaluation
        .timeline
        .iter()
        .filter(|t| {
            t.milestone == MilestoneKind::Store
                && ((t.at > now && !version(&t.version).is_some_and(|v| v.storage))
                    || held.contains(&t.version.as_str()))
        })
        .collect()
}

/// The policy's `preflightLead`, if it gives one (that parses).
fn configured_lead(policy: &VersionPolicy) -> Option<Duration> {
    policy
        .spec
        .migration
        .preflight_lead
        .as_deref()
        .and_then(|text| crate::lifecycle::parse_duration(text).ok())
        .and_then(|lead| Duration::try_from(lead).ok())
}

/// The rate the newest passed preflight read at.
fn newest_rate(status: Option<&VersionPolicyStatus>) -> Option<f64> {
    status
        .into_iter()
        .flat_map(|s| s.preflights.iter().chain(s.preflight.as_ref()))
        .filter(|p| measured_rate(p).is_some())
        .max_by_key(|p| p.finished_at.as_ref().map(|t| t.0))
        .and_then(measured_rate)
}

/// How long before `store` its preflight starts, and the CRD's objects if counted for it.
async fn lead_for(
    ctx: &Context,
    policy: &VersionPolicy,
    store: &Transition,
    configured: Option<Duration>,
    rate: Option<f64>,
    now: Timestamp,
) -> (Duration, Option<u64>) {
    // Counted only once the store is near (a single-object list, cached), whatever
    // the lead: the check before the instant takes longer with more objects.
    let until = store.at.duration_since(now).as_secs_f64();
    let near = until
        <= configured
            .unwrap_or_default()
            .max(MAX_PREFLIGHT_LEAD)
            .as_secs_f64();
    let counted = match near {
        true => ctx.jobs.object_count(policy).await,
        false => None,
    };
    let lead = match (configured, near) {
        (Some(configured), _) => configured,
        (None, true) => preflight_lead(None, counted, rate),
        (None, false) => MAX_PREFLIGHT_LEAD,
    };
    (lead, counted)
}
