//! What to do about a `store`'s conversion preflight, from the policy's status alone (pure):
//! how far ahead it runs (`preflight_lead`), what its result is checked against
//! (`fingerprint`), and whether to run it, check it again before the instant, or wait.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use crate::api::{MigrationPhase, PreflightStatus, VersionPolicyStatus};
use crate::lifecycle::PreflightPass;
use crate::migrate;

/// The shortest lead a derived one has.
const MIN_PREFLIGHT_LEAD: Duration = Duration::from_secs(60);

/// The longest lead a derived one has (a CRD so large that reading it takes longer is
/// better given an explicit `preflightLead`).
pub(super) const MAX_PREFLIGHT_LEAD: Duration = Duration::from_secs(6 * 3600);

/// Objects per second a preflight is assumed to read before one was measured on the CRD:
/// well below what an apiserver answers at the default concurrency, so that the first lead
/// errs long.
const ASSUMED_READ_RATE: f64 = 50.0;

/// How long before a `store`'s instant its conversion preflight starts: `configured` (the
/// policy's `preflightLead`) when given, else twice the time reading `objects` takes at
/// `measured_rate` (objects per second, or `ASSUMED_READ_RATE`) plus the settle check,
/// between `MIN_PREFLIGHT_LEAD` and `MAX_PREFLIGHT_LEAD`.
pub(super) fn preflight_lead(
    configured: Option<Duration>,
    objects: Option<u64>,
    measured_rate: Option<f64>,
) -> Duration {
    if let Some(configured) = configured {
        return configured;
    }
    let rate = measured_rate
        .filter(|r| r.is_finite() && *r > 0.0)
        .unwrap_or(ASSUMED_READ_RATE);
    let reading = objects.unwrap_or(0) as f64 / rate;
    // The settle check (five answers a second apart) and a margin for a slower server.
    let derived = Duration::from_secs_f64((2.0 * reading + 10.0).min(MAX_PREFLIGHT_LEAD.as_secs_f64()));
    derived.clamp(MIN_PREFLIGHT_LEAD, MAX_PREFLIGHT_LEAD)
}

/// How long before the store's instant a passed preflight's objects are checked again
/// (listed, and those created or changed since read): time for one metadata-only listing of
/// `objects` (thousands per second on an apiserver) and a margin for the few reads, so that
/// the check ends before the instant.
fn verify_ahead(objects: u64) -> Duration {
    Duration::from_secs(10) + Duration::from_secs_f64(objects as f64 / 1000.0)
}

/// How long a passed result stands after its objects were last checked: twice
/// `verify_ahead`, so that the store may land up to `verify_ahead` after its instant (a slow
/// reconcile) on the check that started `verify_ahead` before it.
fn stands_for(objects: u64) -> Duration {
    2 * verify_ahead(objects)
}

/// The rate (objects per second) a passed preflight read at, from its status.
pub(super) fn measured_rate(preflight: &PreflightStatus) -> Option<f64> {
    if preflight.phase != MigrationPhase::Succeeded {
        return None;
    }
    let started = preflight.started_at.as_ref()?.0;
    let finished = preflight.finished_at.as_ref()?.0;
    let seconds = finished.duration_since(started).as_secs_f64();
    (seconds > 0.0 && preflight.read > 0).then(|| preflight.read as f64 / seconds)
}

/// What a preflight through `version` checks the objects against: the CRD's conversion
/// (`migrate::conversion_fingerprint`) and the schema of `version` (what converted objects
/// must fit). A result stands only while the CRD's is the same. (The storage version is
/// not part of it: the apiserver converts each object from the version it is stored in,
/// and objects a migration rewrites meanwhile change, so the check before the store reads
/// them again.)
pub(super) fn fingerprint(conversion: &str, schemas: &BTreeMap<String, Value>, version: &str) -> String {
    let schema = schemas.get(version).map(Value::to_string).unwrap_or_default();
    let text = format!("{conversion}\0{version}\0{schema}");
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// [`fingerprint`] of every version of the CRD, as it is now.
pub fn fingerprints(crd: &CustomResourceDefinition) -> BTreeMap<String, String> {
    let conversion = migrate::conversion_fingerprint(crd);
    let schemas = crate::schema::schemas_of(crd);
    crd.spec
        .versions
        .iter()
        .map(|v| (v.name.clone(), fingerprint(&conversion, &schemas, &v.name)))
        .collect()
}

/// The recorded preflight through `version`: its entry of `status.preflights`, else the
/// single `status.preflight` an earlier release wrote, if it was through `version`.
pub(crate) fn recorded<'a>(
    status: Option<&'a VersionPolicyStatus>,
    version: &str,
) -> Option<&'a PreflightStatus> {
    let status = status?;
    status
        .preflights
        .iter()
        .find(|p| p.version == version)
        .or(status.preflight.as_ref().filter(|p| p.version == version))
}

/// A passed result as the store gate sees it: for the store it ran for, checked when it
/// finished or at its last check; `None` unless it passed (and says for which store).
pub(crate) fn pass(recorded: &PreflightStatus) -> Option<PreflightPass> {
    if recorded.phase != MigrationPhase::Succeeded {
        return None;
    }
    let finished = recorded.finished_at.as_ref().map(|t| t.0);
    let verified = recorded.verified_at.as_ref().map(|t| t.0);
    Some(PreflightPass {
        store_at: recorded.store_at.as_ref()?.0,
        checked_at: finished.max(verified)?,
        stands_for: SignedDuration::try_from(stands_for(recorded.read)).unwrap_or(SignedDuration::MAX),
    })
}

/// Why a preflight runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RunReason {
    /// None ran for this store yet, or one was cut short (a restart).
    NotRun,
    /// The last one failed, and the wait before a retry is over.
    Retry,
    /// What the objects are checked against changed since (the conversion, the storage
    /// version, or a schema).
    Changed,
    /// The last one ran for another store of the version.
    OtherStore,
    /// The last one was recorded by an earlier release, which did not record what the
    /// objects were checked against.
    EarlierRelease,
}

impl RunReason {
    /// Why, for the Event (nothing for a first run).
    pub(super) fn describe(self) -> Option<&'static str> {
        match self {
            RunReason::NotRun => None,
            RunReason::Retry => Some("the last one failed"),
            RunReason::Changed => {
                Some("the CRD's conversion, storage version or schemas changed since the last one")
            }
            RunReason::OtherStore => Some("the last one ran for another store of this version"),
            RunReason::EarlierRelease => Some(
                "the last one was recorded by an earlier release of crd-lifecycle, which did not record the schemas it checked against",
            ),
        }
    }
}

/// What to do about one `store`'s preflight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PreflightNeed {
    /// Run it (again).
    Run(RunReason),
    /// It passed for this store: list the objects again, and check those changed since.
    Verify,
    /// Nothing now.
    Nothing,
}

/// The preflight of one `store`: what it checks against, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StorePreflight {
    /// The version the store switches to.
    pub(super) version: String,
    /// The store's instant.
    pub(super) store_at: Timestamp,
    /// What the objects must be checked against, as the CRD is now ([`fingerprint`]).
    pub(super) fingerprint: String,
    /// How long before the instant it starts.
    pub(super) lead: Duration,
    /// The CRD's objects, as best known (for the check's lead).
    pub(super) objects: u64,
    /// How long after a failed preflight the next one may start.
    pub(super) retry_wait: Duration,
}

impl StorePreflight {
    fn start_at(&self) -> Timestamp {
        let lead = SignedDuration::try_from(self.lead).unwrap_or(SignedDuration::MAX);
        self.store_at.checked_sub(lead).unwrap_or(Timestamp::MIN)
    }

    /// When the check before the instant starts.
    fn verify_from(&self) -> Timestamp {
        let ahead = SignedDuration::try_from(verify_ahead(self.objects)).unwrap_or(SignedDuration::MAX);
        self.store_at.checked_sub(ahead).unwrap_or(Timestamp::MIN)
    }

    /// Whether a check recorded at `checked_at` counts as one within the window before the
    /// instant. Status records instants in whole seconds (`metav1.Time`), so a check that
    /// started within the second the window opened counts.
    fn checked_in_window(&self, checked_at: Timestamp) -> bool {
        let from = self.verify_from();
        checked_at >= Timestamp::from_second(from.as_second()).unwrap_or(from)
    }

    /// When a failed preflight may run again.
    fn retry_at(&self, recorded: &PreflightStatus) -> Option<Timestamp> {
        let wait = SignedDuration::try_from(self.retry_wait).unwrap_or(SignedDuration::MAX);
        recorded.finished_at.as_ref()?.0.checked_add(wait).ok()
    }

    /// Decides about this store's preflight at `now`, given the recorded one
    /// ([`recorded`]). A result stands for the store it ran for while the CRD's
    /// [`fingerprint`] is the same; from `verify_ahead` before the instant it must have
    /// been checked since then, and at and after the instant within [`stands_for`].
    pub(super) fn need(&self, recorded: Option<&PreflightStatus>, now: Timestamp) -> PreflightNeed {
        let due_to_start = now >= self.start_at();
        let run = |reason| {
            if due_to_start {
                PreflightNeed::Run(reason)
            } else {
                PreflightNeed::Nothing
            }
        };
        let Some(recorded) = recorded.filter(|p| p.version == self.version) else {
            return run(RunReason::NotRun);
        };
        match recorded.fingerprint.as_deref() {
            None => return run(RunReason::EarlierRelease),
            Some(fingerprint) if fingerprint != self.fingerprint => return run(RunReason::Changed),
            Some(_) => {}
        }
        if recorded.store_at.as_ref().map(|t| t.0) != Some(self.store_at) {
            return run(RunReason::OtherStore);
        }
        match recorded.phase {
            // Recorded as running: run it unless it runs here (`launch` sees that), as after
            // a restart that cut it short.
            MigrationPhase::Running => run(RunReason::NotRun),
            MigrationPhase::Failed if self.retry_at(recorded).is_some_and(|at| now < at) => {
                PreflightNeed::Nothing
            }
            MigrationPhase::Failed => run(RunReason::Retry),
            MigrationPhase::Succeeded => {
                let (Some(pass), Some(_)) = (pass(recorded), &recorded.objects_digest) else {
                    return run(RunReason::EarlierRelease);
                };
                let verify_from = self.verify_from();
                let unchecked = if now < self.store_at {
                    now >= verify_from && !self.checked_in_window(pass.checked_at)
                } else {
                    // Due: the store lands only on a fresh check (a restart, or a late
                    // reconcile, missed the one before the instant).
                    !pass.stands(self.store_at, now)
                };
                if unchecked {
                    PreflightNeed::Verify
                } else {
                    PreflightNeed::Nothing
                }
            }
        }
    }

    /// When to reconcile next for this preflight: when it is to start, when its objects are
    /// to be checked, or when a failed one may run again.
    pub(super) fn wake(&self, recorded: Option<&PreflightStatus>, now: Timestamp) -> Option<Timestamp> {
        let retry = recorded
            .filter(|p| p.version == self.version && p.phase == MigrationPhase::Failed)
            .and_then(|p| self.retry_at(p));
        [Some(self.start_at()), Some(self.verify_from()), retry]
            .into_iter()
            .flatten()
            .filter(|at| *at > now)
            .min()
    }
}

#[cfg(test)]
mod tests;
