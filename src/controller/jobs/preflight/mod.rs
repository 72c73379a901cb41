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
//! (`BackgroundJobs::checked_objects`: 16 bytes per object, more than a status could hold; one
//! set per store to come whose preflight ran, dropped when it lands): a controller without it
//! compares the objects' digest instead, and reads every object again if they changed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::runtime::events::EventType;
use serde_json::{Value, json};
use tracing::warn;

use super::{BackgroundJobs, PREFLIGHT_FIELD_MANAGER, RememberedObjects};
use crate::api::{MigrationPhase, MilestoneKind, PreflightStatus, VersionPolicy, VersionPolicyStatus};
use crate::controller::context::Context;
use crate::controller::status::apply_status;
use crate::lifecycle::{BlockReason, CrdState, Evaluation, PreflightPass};
use crate::migrate::{self, Mode};
use crate::sync::lock;

/// The shortest lead a derived one has.
pub const MIN_PREFLIGHT_LEAD: Duration = Duration::from_secs(60);

/// The longest lead a derived one has (a CRD so large that reading it takes longer is
/// better given an explicit `preflightLead`).
pub const MAX_PREFLIGHT_LEAD: Duration = Duration::from_secs(6 * 3600);

/// Objects per second a preflight is assumed to read before one was measured on the CRD:
/// well below what an apiserver answers at the default concurrency, so that the first lead
/// errs long.
pub const ASSUMED_READ_RATE: f64 = 50.0;

/// How long before a `store`'s instant its conversion preflight starts: `configured` (the
/// policy's `preflightLead`) when given, else twice the time reading `objects` takes at
/// `measured_rate` (objects per second, or `ASSUMED_READ_RATE`) plus the settle check,
/// between `MIN_PREFLIGHT_LEAD` and `MAX_PREFLIGHT_LEAD`.
pub fn preflight_lead(
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
pub fn verify_ahead(objects: u64) -> Duration {
    Duration::from_secs(10) + Duration::from_secs_f64(objects as f64 / 1000.0)
}

/// How long a passed result stands after its objects were last checked: twice
/// `verify_ahead`, so that the store may land up to `verify_ahead` after its instant (a slow
/// reconcile) on the check that started `verify_ahead` before it.
pub fn stands_for(objects: u64) -> Duration {
    2 * verify_ahead(objects)
}

/// The rate (objects per second) a passed preflight read at, from its status.
pub fn measured_rate(preflight: &PreflightStatus) -> Option<f64> {
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
pub fn fingerprint(conversion: &str, schemas: &BTreeMap<String, Value>, version: &str) -> String {
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
pub fn recorded<'a>(status: Option<&'a VersionPolicyStatus>, version: &str) -> Option<&'a PreflightStatus> {
    let status = status?;
    status
        .preflights
        .iter()
        .find(|p| p.version == version)
        .or(status.preflight.as_ref().filter(|p| p.version == version))
}

/// A passed result as the store gate sees it: for the store it ran for, checked when it
/// finished or at its last check; `None` unless it passed (and says for which store).
pub fn pass(recorded: &PreflightStatus) -> Option<PreflightPass> {
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
pub enum RunReason {
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
    pub fn describe(self) -> Option<&'static str> {
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
pub enum PreflightNeed {
    /// Run it (again).
    Run(RunReason),
    /// It passed for this store: list the objects again, and check those changed since.
    Verify,
    /// Nothing now.
    Nothing,
}

/// The preflight of one `store`: what it checks against, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorePreflight {
    /// The version the store switches to.
    pub version: String,
    /// The store's instant.
    pub store_at: Timestamp,
    /// What the objects must be checked against, as the CRD is now ([`fingerprint`]).
    pub fingerprint: String,
    /// How long before the instant it starts.
    pub lead: Duration,
    /// The CRD's objects, as best known (for the check's lead).
    pub objects: u64,
    /// How long after a failed preflight the next one may start.
    pub retry_wait: Duration,
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
    pub fn need(&self, recorded: Option<&PreflightStatus>, now: Timestamp) -> PreflightNeed {
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
    pub fn wake(&self, recorded: Option<&PreflightStatus>, now: Timestamp) -> Option<Timestamp> {
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
    let stores: Vec<_> = evaluation
        .timeline
        .iter()
        .filter(|t| {
            t.milestone == MilestoneKind::Store
                && ((t.at > now && !version(&t.version).is_some_and(|v| v.storage))
                    || held.contains(&t.version.as_str()))
        })
        .collect();
    // What this controller remembers of the objects preflights read: only for stores to come.
    let upcoming: Vec<&str> = stores.iter().map(|s| s.version.as_str()).collect();
    ctx.jobs.forget_checked_objects(&policy.spec.crd_name, &upcoming);
    let status = policy.status.as_ref();
    let configured = policy
        .spec
        .migration
        .preflight_lead
        .as_deref()
        .and_then(|text| crate::lifecycle::parse_duration(text).ok())
        .and_then(|lead| Duration::try_from(lead).ok());
    // The rate the newest passed preflight read at.
    let rate = status
        .into_iter()
        .flat_map(|s| s.preflights.iter().chain(s.preflight.as_ref()))
        .filter(|p| measured_rate(p).is_some())
        .max_by_key(|p| p.finished_at.as_ref().map(|t| t.0))
        .and_then(measured_rate);
    let mut wake: Option<Timestamp> = None;
    for store in stores {
        let Some(fingerprint) = fingerprints.get(&store.version) else {
            continue;
        };
        let recorded = recorded(status, &store.version);
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

/// The key a CRD's preflight through `version` runs (and is remembered) under.
fn preflight_key(crd: &str, version: &str) -> String {
    format!("preflight/{crd}/{version}")
}

/// The field manager of the preflight through `version`: one per version, so that a
/// server-side apply of one entry of `status.preflights` neither drops nor overwrites
/// another's.
pub fn preflight_manager(version: &str) -> String {
    format!("{PREFLIGHT_FIELD_MANAGER}-{version}")
}

/// What a check before the store found.
enum Check {
    /// Every object fits: unchanged since they were checked, or read again and fit.
    Fit {
        /// Objects listed.
        listed: u64,
        /// Those read again (created or changed since).
        reread: u64,
        digest: String,
        /// The objects as listed, when they were listed by a run that can say.
        checked: Option<migrate::CheckedObjects>,
    },
    /// Objects read again do not fit.
    Failed(Box<migrate::Report>),
    /// It cannot be told without reading every object again: why.
    Repeat(String),
}

impl BackgroundJobs {
    /// Remembers the objects the passed preflight of `key` read, for the result with
    /// `digest` and `fingerprint`.
    fn remember_checked_objects(
        &self,
        key: &str,
        digest: &str,
        fingerprint: &str,
        objects: migrate::CheckedObjects,
    ) {
        lock(&self.checked_objects).insert(
            key.to_owned(),
            RememberedObjects {
                digest: digest.to_owned(),
                fingerprint: fingerprint.to_owned(),
                objects: Arc::new(objects),
            },
        );
    }

    /// The objects the passed preflight of `key` read, if they are those of the result with
    /// `digest` and `fingerprint`.
    fn checked_objects_of(
        &self,
        key: &str,
        digest: &str,
        fingerprint: &str,
    ) -> Option<Arc<migrate::CheckedObjects>> {
        lock(&self.checked_objects)
            .get(key)
            .filter(|r| r.digest == digest && r.fingerprint == fingerprint)
            .map(|r| r.objects.clone())
    }

    /// Forgets the objects the preflight of `key` read.
    fn forget_checked_objects_of(&self, key: &str) {
        lock(&self.checked_objects).remove(key);
    }

    /// Forgets the objects preflights of the CRD read, but for those through `keep`
    /// (versions whose store is still to come).
    fn forget_checked_objects(&self, crd: &str, keep: &[&str]) {
        let prefix = preflight_key(crd, "");
        lock(&self.checked_objects).retain(|key, _| {
            key.strip_prefix(&prefix)
                .is_none_or(|version| keep.contains(&version))
        });
    }

    /// Starts the conversion preflight of `plan` (every object of the policy's CRD read
    /// through its version, nothing written) unless it runs already; the task decides again
    /// on the policy as the apiserver has it (the cache may lag behind this controller's
    /// own writes: a result that passed or failed moments ago is not run again). The result
    /// goes to the version's entry of `status.preflights`.
    pub fn ensure_preflight(self: &Arc<Self>, policy: &VersionPolicy, plan: StorePreflight) {
        let key = preflight_key(&policy.spec.crd_name, &plan.version);
        let this = self.clone();
        let policy = policy.clone();
        self.launch(key, plan.version.clone(), false, async move {
            let policy = this.fresh(policy).await;
            let status = policy.status.as_ref();
            if let PreflightNeed::Run(reason) = plan.need(recorded(status, &plan.version), this.now()) {
                this.run_preflight(policy, plan, reason.describe().map(str::to_owned))
                    .await;
            }
        });
    }

    /// Checks a passed preflight of `plan` before its store: lists the objects again and
    /// reads, converts and checks those created or changed since it read them (the set it
    /// read is remembered here); without that set (a controller started since), compares
    /// their digest, and reads every object again if it differs. Fit, the result's
    /// `verifiedAt` says when the check started; an object that does not fit fails it.
    pub fn verify_preflight(self: &Arc<Self>, policy: &VersionPolicy, plan: StorePreflight) {
        let key = preflight_key(&policy.spec.crd_name, &plan.version);
        let this = self.clone();
        let policy = policy.clone();
        self.launch(key.clone(), plan.version.clone(), false, async move {
            let policy = this.fresh(policy).await;
            let started = this.now();
            let Some(recorded) = recorded(policy.status.as_ref(), &plan.version).cloned() else {
                return;
            };
            match plan.need(Some(&recorded), started) {
                PreflightNeed::Verify => {}
                PreflightNeed::Run(reason) => {
                    let why = reason.describe().map(str::to_owned);
                    return this.run_preflight(policy, plan, why).await;
                }
                PreflightNeed::Nothing => return,
            }
            let name = policy.metadata.name.clone().unwrap_or_default();
            let reference = policy.object_ref(&());
            let crd = &policy.spec.crd_name;
            let version = &plan.version;
            match this.check(&policy, &plan, &key, &recorded).await {
                Check::Fit {
                    listed,
                    reread,
                    digest,
                    checked,
                } => {
                    let mut result = recorded.clone();
                    result.verified_at = Some(Time(started));
                    result.read = listed;
                    result.objects_digest = Some(digest.clone());
                    let note = format!(
                        "objects of {crd} checked again for the {version} store at {}: {reread} of {listed} created or changed since were read through {version} and fit",
                        plan.store_at
                    );
                    result.message = Some(note.clone());
                    this.write_preflight(&policy, &result).await;
                    if let Some(checked) = checked {
                        this.remember_checked_objects(&key, &digest, &plan.fingerprint, checked);
                    }
                    this.event(&reference, EventType::Normal, "PreflightVerified", note)
                        .await;
                }
                Check::Failed(report) => {
                    this.forget_checked_objects_of(&key);
                    let mut result = recorded.clone();
                    result.phase = MigrationPhase::Failed;
                    result.finished_at = Some(Time(this.now()));
                    result.failed = report.counts.failed;
                    result.failures = report.failures.iter().map(ToString::to_string).collect();
                    let note = format!(
                        "objects created or changed since the preflight: {}",
                        report.summary()
                    );
                    result.message = Some(note.clone());
                    warn!(policy = name, "{note}");
                    this.write_preflight(&policy, &result).await;
                    this.event(&reference, EventType::Warning, "ConversionPreflightFailed", note)
                        .await;
                }
                Check::Repeat(reason) => {
                    let note = format!("conversion preflight of {version} runs again: {reason}");
                    this.event(&reference, EventType::Normal, "PreflightRepeated", note)
                        .await;
                    this.run_preflight(policy, plan, None).await;
                }
            }
        });
    }

    /// Lists the objects again and checks those changed since `recorded` read them.
    async fn check(
        &self,
        policy: &VersionPolicy,
        plan: &StorePreflight,
        key: &str,
        recorded: &PreflightStatus,
    ) -> Check {
        let crd = &policy.spec.crd_name;
        let Some(digest) = recorded.objects_digest.clone() else {
            return Check::Repeat("the result does not say which objects it read".to_owned());
        };
        let Some(checked) = self.checked_objects_of(key, &digest, &plan.fingerprint) else {
            // Without the set (a controller started since): unchanged or not at all.
            let settings = migrate::Settings {
                page_size: policy.spec.migration.page_size,
                retry: self.retry.clone(),
                ..migrate::Settings::default()
            };
            return match migrate::objects_digest(&self.client, crd, &settings).await {
                Ok(now) if now == digest => Check::Fit {
                    listed: recorded.read,
                    reread: 0,
                    digest,
                    checked: None,
                },
                Ok(_) => Check::Repeat(
                    "the objects changed since it passed, and this controller (started since) does not know which"
                        .to_owned(),
                ),
                Err(error) => Check::Repeat(format!(
                    "the objects could not be listed to check they did not change: {error}"
                )),
            };
        };
        let settings = migrate::Settings {
            preflight_checked: Some(checked),
            ..self.preflight_settings(policy, &plan.version)
        };
        match migrate::migrate(&self.client, crd, &settings, &migrate::Quiet).await {
            Ok(report) if !report.succeeded() => Check::Failed(Box::new(report)),
            Ok(report) => {
                let fingerprint = report_fingerprint(&report);
                match report.objects_digest.clone() {
                    Some(digest) if fingerprint == plan.fingerprint => Check::Fit {
                        listed: report.counts.listed,
                        reread: report.counts.rewritten,
                        digest,
                        checked: report.checked_objects,
                    },
                    Some(_) => Check::Repeat(
                        "the CRD's conversion, storage version or schemas changed meanwhile".to_owned(),
                    ),
                    None => Check::Repeat("the objects could not be listed in one pass".to_owned()),
                }
            }
            Err(error) => Check::Repeat(format!("the objects could not be checked again: {error}")),
        }
    }

    /// How a preflight of the policy's CRD through `version` reads.
    fn preflight_settings(&self, policy: &VersionPolicy, version: &str) -> migrate::Settings {
        migrate::Settings {
            concurrency: usize::try_from(policy.spec.migration.concurrency).unwrap_or(16),
            page_size: policy.spec.migration.page_size,
            qps: policy.spec.migration.qps,
            mode: Mode::Preflight,
            through_version: Some(version.to_owned()),
            // The CRD converts through the operator's webhook: check what it produces
            // against the schema too (the apiserver prunes silently on read).
            preflight_conversion: policy.spec.conversion.clone().filter(|c| c.webhook.enabled),
            retry: self.retry.clone(),
            settle: self.settle.clone(),
            ..migrate::Settings::default()
        }
    }

    async fn run_preflight(
        self: Arc<Self>,
        mut policy: VersionPolicy,
        plan: StorePreflight,
        why: Option<String>,
    ) {
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let crd = policy.spec.crd_name.clone();
        let reference = policy.object_ref(&());
        let version = plan.version.clone();
        let key = preflight_key(&crd, &version);
        self.forget_checked_objects_of(&key);
        let ahead = Some(plan.store_at)
            .filter(|at| *at > self.now())
            .map(|at| format!(" ahead of the {version} store at {at}"))
            .unwrap_or_default();
        let mut status = PreflightStatus {
            version: version.clone(),
            phase: MigrationPhase::Running,
            started_at: Some(Time(self.now())),
            finished_at: None,
            store_at: Some(Time(plan.store_at)),
            read: 0,
            objects_digest: None,
            fingerprint: Some(plan.fingerprint.clone()),
            conversion: None,
            verified_at: None,
            failed: 0,
            failures: Vec::new(),
            message: Some(format!("reading every object of {crd} through {version}{ahead}")),
        };
        self.write_preflight(&policy, &status).await;
        // The former single result is cleared with the first write.
        if let Some(recorded) = policy.status.as_mut() {
            recorded.preflight = None;
        }
        let because = why.map(|why| format!(" ({why})")).unwrap_or_default();
        let note =
            format!("conversion preflight: reading every object of {crd} through {version}{ahead}{because}");
        self.event(&reference, EventType::Normal, "PreflightStarted", note)
            .await;
        let settings = self.preflight_settings(&policy, &version);
        let result = migrate::migrate(&self.client, &crd, &settings, &migrate::Quiet).await;
        status.finished_at = Some(Time(self.now()));
        let passed = match result {
            Ok(report) => {
                status.read = report.counts.rewritten;
                status.failed = report.counts.failed;
                status.failures = report.failures.iter().map(ToString::to_string).collect();
                status.message = Some(report.summary());
                status.objects_digest = report.objects_digest.clone();
                let fingerprint = report_fingerprint(&report);
                status.fingerprint = Some(fingerprint.clone());
                let passed = report.succeeded();
                if passed
                    && let (Some(digest), Some(checked)) = (report.objects_digest, report.checked_objects)
                {
                    self.remember_checked_objects(&key, &digest, &fingerprint, checked);
                }
                passed
            }
            Err(error) => {
                status.message = Some(error.to_string());
                false
            }
        };
        let (phase, type_, reason) = if passed {
            (MigrationPhase::Succeeded, EventType::Normal, "PreflightSucceeded")
        } else {
            (
                MigrationPhase::Failed,
                EventType::Warning,
                "ConversionPreflightFailed",
            )
        };
        status.phase = phase;
        self.write_preflight(&policy, &status).await;
        let note = status.message.clone().unwrap_or_default();
        self.event(&reference, type_, reason, note).await;
    }

    /// Writes the preflight's entry of `status.preflights` under its version's field
    /// manager; clears the single `status.preflight` an earlier release wrote (read until
    /// then, see [`recorded`]).
    async fn write_preflight(&self, policy: &VersionPolicy, status: &PreflightStatus) {
        let name = policy.metadata.name.clone().unwrap_or_default();
        let manager = preflight_manager(&status.version);
        let entry = json!({"preflights": [status]});
        if let Err(error) = apply_status(&self.client, &name, &manager, entry).await {
            warn!(policy = name, error = %error, "cannot write the preflight status");
        }
        if policy.status.as_ref().is_some_and(|s| s.preflight.is_some()) {
            // Its field manager applies nothing: the field it owned goes.
            if let Err(error) = apply_status(&self.client, &name, PREFLIGHT_FIELD_MANAGER, json!({})).await {
                warn!(policy = name, error = %error, "cannot clear the former status.preflight");
            }
        }
    }
}

/// The [`fingerprint`] of what a preflight run checked against (the CRD as it read it).
fn report_fingerprint(report: &migrate::Report) -> String {
    let target = &report.target;
    fingerprint(&target.conversion, &target.schemas, &target.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    const STORE: &str = "2026-01-01T01:00:00Z";

    fn passed(finished: &str) -> PreflightStatus {
        PreflightStatus {
            version: "v1".to_owned(),
            phase: MigrationPhase::Succeeded,
            started_at: Some(Time(at("2026-01-01T00:50:00Z"))),
            finished_at: Some(Time(at(finished))),
            store_at: Some(Time(at(STORE))),
            read: 5000,
            objects_digest: Some("5000-00ff".to_owned()),
            fingerprint: Some("abc".to_owned()),
            conversion: None,
            verified_at: None,
            failed: 0,
            failures: Vec::new(),
            message: None,
        }
    }

    /// The v1 store at `STORE` with a 10 minute lead, 5,000 objects: its check starts 15 s
    /// before the instant.
    fn plan() -> StorePreflight {
        StorePreflight {
            version: "v1".to_owned(),
            store_at: at(STORE),
            fingerprint: "abc".to_owned(),
            lead: Duration::from_secs(600),
            objects: 5000,
            retry_wait: Duration::from_secs(300),
        }
    }

    #[test]
    fn the_lead_is_derived_from_objects_and_rate_and_at_least_a_minute() {
        assert_eq!(preflight_lead(None, None, None), MIN_PREFLIGHT_LEAD);
        assert_eq!(preflight_lead(None, Some(100), None), MIN_PREFLIGHT_LEAD);
        // 50,000 objects at the assumed 50/s: 1,000 s of reading, twice, plus 10 s.
        assert_eq!(
            preflight_lead(None, Some(50_000), None),
            Duration::from_secs(2010)
        );
        // A measured 1,000/s shortens it.
        assert_eq!(
            preflight_lead(None, Some(50_000), Some(1000.0)),
            Duration::from_secs(110)
        );
        assert_eq!(
            preflight_lead(None, Some(u64::MAX), Some(1.0)),
            MAX_PREFLIGHT_LEAD
        );
        // Configured: as given, even under a minute.
        let configured = Some(Duration::from_secs(20));
        assert_eq!(
            preflight_lead(configured, Some(50_000), None),
            Duration::from_secs(20)
        );
    }

    #[test]
    fn the_rate_is_read_from_the_last_passed_preflight() {
        let status = passed("2026-01-01T00:50:10Z");
        assert_eq!(measured_rate(&status), Some(500.0));
        let mut running = status.clone();
        running.finished_at = None;
        assert_eq!(measured_rate(&running), None);
        let mut failed = status.clone();
        failed.phase = MigrationPhase::Failed;
        assert_eq!(measured_rate(&failed), None);
    }

    #[test]
    fn a_preflight_starts_at_its_lead_and_stands_for_its_store_while_nothing_changed() {
        let plan = plan();
        let need = |recorded: Option<&PreflightStatus>, now: &str| plan.need(recorded, at(now));
        assert_eq!(need(None, "2026-01-01T00:49:59Z"), PreflightNeed::Nothing);
        assert_eq!(
            need(None, "2026-01-01T00:50:00Z"),
            PreflightNeed::Run(RunReason::NotRun)
        );
        let done = passed("2026-01-01T00:51:00Z");
        assert_eq!(need(Some(&done), "2026-01-01T00:52:00Z"), PreflightNeed::Nothing);
        // Another version's result does not count.
        let mut other = done.clone();
        other.version = "v2".to_owned();
        assert_eq!(
            need(Some(&other), "2026-01-01T00:52:00Z"),
            PreflightNeed::Run(RunReason::NotRun)
        );
        // What the objects are checked against changed (conversion, storage version, a
        // schema): run again; not before the lead, though.
        let mut changed = done.clone();
        changed.fingerprint = Some("xyz".to_owned());
        assert_eq!(
            need(Some(&changed), "2026-01-01T00:52:00Z"),
            PreflightNeed::Run(RunReason::Changed)
        );
        assert_eq!(
            need(Some(&changed), "2026-01-01T00:40:00Z"),
            PreflightNeed::Nothing
        );
        // A result for another store of v1 (an earlier one, or the store moved).
        let mut earlier = done.clone();
        earlier.store_at = Some(Time(at("2025-12-01T00:00:00Z")));
        assert_eq!(
            need(Some(&earlier), "2026-01-01T00:52:00Z"),
            PreflightNeed::Run(RunReason::OtherStore)
        );
        // An earlier release's result (no fingerprint): run again, knowingly.
        let mut legacy = done.clone();
        legacy.fingerprint = None;
        legacy.conversion = Some("abc".to_owned());
        assert_eq!(
            need(Some(&legacy), "2026-01-01T00:52:00Z"),
            PreflightNeed::Run(RunReason::EarlierRelease)
        );
        // One recorded as running (maybe by a controller that restarted since) is ensured:
        // `ensure_preflight` starts it only if it does not run here.
        let mut running = done.clone();
        running.phase = MigrationPhase::Running;
        assert_eq!(
            need(Some(&running), "2026-01-01T00:52:00Z"),
            PreflightNeed::Run(RunReason::NotRun)
        );
    }

    #[test]
    fn a_passed_result_is_checked_before_the_instant_and_stands_only_shortly_after_a_check() {
        let plan = plan();
        let need = |recorded: &PreflightStatus, now: &str| plan.need(Some(recorded), at(now));
        let done = passed("2026-01-01T00:51:00Z");
        // 10 s plus 5 s for 5,000 objects before the instant, whatever the lead.
        assert_eq!(need(&done, "2026-01-01T00:59:44Z"), PreflightNeed::Nothing);
        assert_eq!(need(&done, "2026-01-01T00:59:45Z"), PreflightNeed::Verify);
        let mut verified = done.clone();
        verified.verified_at = Some(Time(at("2026-01-01T00:59:45Z")));
        assert_eq!(need(&verified, "2026-01-01T00:59:50Z"), PreflightNeed::Nothing);
        assert_eq!(need(&verified, STORE), PreflightNeed::Nothing);
        // It stands for 30 s after the check: a reconcile 10 s late still lands the store
        // on it.
        assert_eq!(need(&verified, "2026-01-01T01:00:10Z"), PreflightNeed::Nothing);
        assert_eq!(
            pass(&verified).map(|p| p.stands(at(STORE), at("2026-01-01T01:00:10Z"))),
            Some(true)
        );
        // A preflight that ended within the window needs no check.
        let late = passed("2026-01-01T00:59:50Z");
        assert_eq!(need(&late, "2026-01-01T00:59:55Z"), PreflightNeed::Nothing);
        // Status records whole seconds: a check that started in the second the window
        // opened counts (30 objects: the window opens at 00:59:49.97).
        let few = StorePreflight {
            objects: 30,
            ..plan.clone()
        };
        let mut verified_then = done.clone();
        verified_then.read = 30;
        verified_then.verified_at = Some(Time(at("2026-01-01T00:59:49Z")));
        assert_eq!(
            few.need(Some(&verified_then), at("2026-01-01T00:59:51Z")),
            PreflightNeed::Nothing
        );
        verified_then.verified_at = Some(Time(at("2026-01-01T00:59:48Z")));
        assert_eq!(
            few.need(Some(&verified_then), at("2026-01-01T00:59:51Z")),
            PreflightNeed::Verify
        );
        // The check was missed (the controller was down): at the instant and after it, the
        // result does not stand and is checked first.
        assert_eq!(need(&done, STORE), PreflightNeed::Verify);
        assert_eq!(need(&done, "2026-01-01T04:00:00Z"), PreflightNeed::Verify);
        assert_eq!(
            pass(&done).map(|p| p.stands(at(STORE), at("2026-01-01T04:00:00Z"))),
            Some(false)
        );
        assert_eq!(need(&verified, "2026-01-01T04:00:00Z"), PreflightNeed::Verify);
        let mut checked_late = verified.clone();
        checked_late.verified_at = Some(Time(at("2026-01-01T03:59:58Z")));
        assert_eq!(
            need(&checked_late, "2026-01-01T04:00:00Z"),
            PreflightNeed::Nothing
        );
    }

    #[test]
    fn a_failed_preflight_runs_again_after_the_wait_by_its_status() {
        let plan = plan();
        let mut failed = passed("2026-01-01T00:51:00Z");
        failed.phase = MigrationPhase::Failed;
        assert_eq!(
            plan.need(Some(&failed), at("2026-01-01T00:55:59Z")),
            PreflightNeed::Nothing
        );
        assert_eq!(
            plan.wake(Some(&failed), at("2026-01-01T00:55:59Z")),
            Some(at("2026-01-01T00:56:00Z"))
        );
        assert_eq!(
            plan.need(Some(&failed), at("2026-01-01T00:56:00Z")),
            PreflightNeed::Run(RunReason::Retry)
        );
        // Fixed (the conversion changed): at once.
        failed.fingerprint = Some("fixed".to_owned());
        assert_eq!(
            plan.need(Some(&failed), at("2026-01-01T00:52:00Z")),
            PreflightNeed::Run(RunReason::Changed)
        );
    }

    #[test]
    fn it_wakes_to_start_and_to_check() {
        let plan = plan();
        assert_eq!(
            plan.wake(None, at("2026-01-01T00:00:00Z")),
            Some(at("2026-01-01T00:50:00Z"))
        );
        assert_eq!(
            plan.wake(None, at("2026-01-01T00:50:00Z")),
            Some(at("2026-01-01T00:59:45Z"))
        );
        assert_eq!(plan.wake(None, at("2026-01-01T00:59:45Z")), None);
    }

    #[test]
    fn the_fingerprint_covers_the_conversion_and_the_schema_of_the_version() {
        let schemas: BTreeMap<String, Value> = [
            ("v1alpha1".to_owned(), json!({"type": "object"})),
            (
                "v1".to_owned(),
                json!({"type": "object", "properties": {"spec": {"type": "object"}}}),
            ),
        ]
        .into();
        let base = fingerprint("conv", &schemas, "v1");
        assert_eq!(base, fingerprint("conv", &schemas, "v1"));
        assert_ne!(base, fingerprint("other", &schemas, "v1"), "the conversion");
        assert_ne!(base, fingerprint("conv", &schemas, "v1alpha1"), "another version");
        let mut target = schemas.clone();
        target.insert(
            "v1".to_owned(),
            json!({"type": "object", "properties": {"spec": {"type": "string"}}}),
        );
        assert_ne!(base, fingerprint("conv", &target, "v1"), "the version's schema");
        let mut unrelated = schemas.clone();
        unrelated.insert("v1alpha1".to_owned(), json!({"type": "string"}));
        assert_eq!(
            base,
            fingerprint("conv", &unrelated, "v1"),
            "another version's schema"
        );
    }
}
