//! Conversion preflights: before a `store`, every object is read through the version it
//! switches to (nothing written); the result goes to `status.preflight` and gates the store.
//!
//! A preflight runs ahead of its store's instant, by the policy's `preflightLead` or by a
//! lead derived from the CRD's object count and the rate the last preflight read at. Its
//! result stands for the store while the CRD's conversion and objects are unchanged: the
//! objects are listed again (names and resourceVersions only) shortly before the instant,
//! and any change runs the preflight again.

use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::warn;

use super::context::Context;
use super::migrations::{Migrations, PREFLIGHT_FIELD_MANAGER, PREFLIGHT_STANDS_FOR};
use super::status::apply_status;
use crate::api::{MigrationPhase, MilestoneKind, PreflightStatus, VersionPolicy};
use crate::lifecycle::{BlockReason, CrdState, Evaluation};
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

/// How long before the store's instant a passed preflight's objects are listed again to
/// check they did not change: time for one metadata-only listing of `objects` (thousands per
/// second on an apiserver) and a margin, so that the check ends before the instant.
pub fn verify_ahead(objects: u64) -> Duration {
    Duration::from_secs(10) + Duration::from_secs_f64(objects as f64 / 1000.0)
}

/// The rate (objects per second) a finished preflight read at, from its status.
pub fn measured_rate(preflight: &PreflightStatus) -> Option<f64> {
    let started = preflight.started_at.as_ref()?.0;
    let finished = preflight.finished_at.as_ref()?.0;
    let seconds = finished.duration_since(started).as_secs_f64();
    (seconds > 0.0 && preflight.read > 0).then(|| preflight.read as f64 / seconds)
}

/// What to do about one `store`'s preflight, decided from the policy's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreflightNeed {
    /// Run it (again): none ran for this version, it failed, or its conversion changed.
    Run { stale: bool },
    /// Its result stands; list the objects again to check they did not change.
    Verify { digest: String },
    /// Nothing now.
    Nothing,
}

/// Decides about the preflight of `version`'s store at `store_at`, at `now`, given the
/// recorded result and the CRD's current conversion fingerprint.
pub fn preflight_need(
    recorded: Option<&PreflightStatus>,
    version: &str,
    conversion: &str,
    store_at: Timestamp,
    lead: Duration,
    objects: u64,
    now: Timestamp,
) -> PreflightNeed {
    let due_to_start = now.duration_since(store_at).as_secs_f64() >= -lead.as_secs_f64();
    let Some(recorded) = recorded.filter(|p| p.version == version) else {
        return if due_to_start {
            PreflightNeed::Run { stale: false }
        } else {
            PreflightNeed::Nothing
        };
    };
    let stale = recorded.conversion.as_deref().is_some_and(|c| c != conversion);
    match recorded.phase {
        _ if stale && due_to_start => PreflightNeed::Run { stale: true },
        // Recorded as running: run it unless it runs here (`launch` sees that), as
        // after a restart that cut a preflight short.
        MigrationPhase::Running if due_to_start => PreflightNeed::Run { stale: false },
        MigrationPhase::Running => PreflightNeed::Nothing,
        MigrationPhase::Failed if due_to_start => PreflightNeed::Run { stale: false },
        MigrationPhase::Failed => PreflightNeed::Nothing,
        // A result that says nothing of the objects it read (recorded before results did)
        // stands only if it ran within the lead.
        MigrationPhase::Succeeded
            if recorded.objects_digest.is_none()
                && due_to_start
                && recorded
                    .finished_at
                    .as_ref()
                    .is_none_or(|t| store_at.duration_since(t.0).as_secs_f64() > lead.as_secs_f64()) =>
        {
            PreflightNeed::Run { stale: true }
        }
        MigrationPhase::Succeeded => {
            let verify_from = store_at.checked_sub(verify_ahead(objects)).unwrap_or(store_at);
            let finished = recorded.finished_at.as_ref().map(|t| t.0);
            let verified = recorded.verified_at.as_ref().map(|t| t.0);
            let checked_since = verified.max(finished);
            match (&recorded.objects_digest, checked_since) {
                (Some(digest), Some(last)) if now >= verify_from && now < store_at && last < verify_from => {
                    PreflightNeed::Verify {
                        digest: digest.clone(),
                    }
                }
                _ => PreflightNeed::Nothing,
            }
        }
    }
}

/// Starts, checks and schedules the conversion preflights of a policy's stores: a due store
/// held for its preflight runs it now; an upcoming one runs it ahead of its instant (by the
/// policy's `preflightLead`, or a lead derived from the object count and the rate the last
/// preflight read at), once its version is served. A passed result stands while the CRD's
/// conversion (`conversion`, its fingerprint) is unchanged, and its objects are checked once
/// more shortly before the instant. Returns when to wake for the next start or check; a
/// missing grant goes to `missing_permissions`.
pub(super) async fn schedule(
    policy: &VersionPolicy,
    ctx: &Context,
    evaluation: &Evaluation,
    crd: Option<&CrdState>,
    conversion: &str,
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
    let stores = evaluation.timeline.iter().filter(|t| {
        t.milestone == MilestoneKind::Store
            && ((t.at > now && !version(&t.version).is_some_and(|v| v.storage))
                || held.contains(&t.version.as_str()))
    });
    let recorded = policy.status.as_ref().and_then(|s| s.preflight.as_ref());
    let configured = policy
        .spec
        .migration
        .preflight_lead
        .as_deref()
        .and_then(|text| crate::lifecycle::parse_duration(text).ok())
        .and_then(|lead| Duration::try_from(lead).ok());
    let mut wake: Option<Timestamp> = None;
    for store in stores {
        // Counted only once the store is near (a single-object list, cached).
        let near = store.at.duration_since(now).as_secs_f64() <= MAX_PREFLIGHT_LEAD.as_secs_f64();
        let objects = match (configured, near) {
            (None, true) => ctx.migrations.object_count(policy).await,
            _ => None,
        };
        let lead = if near || configured.is_some() {
            preflight_lead(configured, objects, recorded.and_then(measured_rate))
        } else {
            MAX_PREFLIGHT_LEAD
        };
        let need = preflight_need(
            recorded,
            &store.version,
            conversion,
            store.at,
            lead,
            objects.unwrap_or(0),
            now,
        );
        match need {
            PreflightNeed::Run { stale } if version(&store.version).is_some_and(|v| v.served) => {
                match ctx.migrations.check_permissions(policy, Mode::Preflight).await {
                    Ok(()) => {
                        let store_at = (store.at > now).then_some(store.at);
                        ctx.migrations
                            .ensure_preflight(policy, &store.version, store_at, stale);
                    }
                    Err(message) => missing_permissions.push(message),
                }
            }
            PreflightNeed::Verify { digest } => {
                ctx.migrations
                    .verify_preflight(policy, &store.version, digest, store.at);
            }
            _ => {}
        }
        // Wake when the preflight is to start, or its objects are to be checked.
        let verify_at = store.at.checked_sub(verify_ahead(objects.unwrap_or(0))).ok();
        let start_at = store
            .at
            .checked_sub(SignedDuration::try_from(lead).unwrap_or(SignedDuration::ZERO))
            .ok();
        wake = [wake, start_at, verify_at]
            .into_iter()
            .flatten()
            .filter(|at| *at > now)
            .min();
    }
    wake
}

/// The key a CRD's preflight through `version` runs (and is remembered) under.
fn preflight_key(crd: &str, version: &str) -> String {
    format!("preflight/{crd}/{version}")
}

impl Migrations {
    /// Starts a conversion preflight of the policy's CRD through `version` (every object
    /// read through it, nothing written) unless one runs or failed recently, or (unless
    /// `stale`: its conversion changed since) passed moments ago; the result goes to
    /// `status.preflight`. `store_at`: the instant of the store it runs ahead of.
    pub fn ensure_preflight(
        self: &Arc<Self>,
        policy: &VersionPolicy,
        version: &str,
        store_at: Option<Timestamp>,
        stale: bool,
    ) {
        let key = preflight_key(&policy.spec.crd_name, version);
        let passed_moments_ago = lock(&self.passed_at)
            .get(&key)
            .is_some_and(|at| at.elapsed() < PREFLIGHT_STANDS_FOR);
        let this = self.clone();
        let policy = policy.clone();
        let target = version.to_owned();
        self.launch(
            key,
            version.to_owned(),
            !stale && passed_moments_ago,
            async move { this.run_preflight(policy, target, store_at).await },
        );
    }

    /// Lists the CRD's objects again (names and resourceVersions) and compares them with
    /// those the passed preflight of `version` read: unchanged, `status.preflight.verifiedAt`
    /// says so; changed (or not listable), the preflight runs again.
    pub fn verify_preflight(
        self: &Arc<Self>,
        policy: &VersionPolicy,
        version: &str,
        digest: String,
        store_at: Timestamp,
    ) {
        let key = preflight_key(&policy.spec.crd_name, version);
        let this = self.clone();
        let policy = policy.clone();
        let goal = version.to_owned();
        let version = version.to_owned();
        self.launch(key, goal, false, async move {
            let settings = migrate::Settings {
                page_size: policy.spec.migration.page_size,
                retry: this.retry.clone(),
                ..migrate::Settings::default()
            };
            let now = migrate::objects_digest(&this.client, &policy.spec.crd_name, &settings).await;
            let name = policy.metadata.name.clone().unwrap_or_default();
            let reason = match now {
                Ok(now) if now == digest => {
                    // The whole result again: a server-side apply drops what it leaves out.
                    if let Some(mut recorded) = policy.status.as_ref().and_then(|s| s.preflight.clone()) {
                        recorded.verified_at = Some(Time(this.now()));
                        this.write_preflight(&name, &recorded).await;
                    }
                    return;
                }
                Ok(_) => "the objects changed since it passed".to_owned(),
                Err(error) => {
                    format!("the objects could not be listed to check they did not change: {error}")
                }
            };
            let reference = policy.object_ref(&());
            let note = format!("conversion preflight of {version} runs again: {reason}");
            this.event(&reference, EventType::Normal, "PreflightRepeated", note)
                .await;
            this.run_preflight(policy, version, Some(store_at)).await;
        });
    }

    async fn run_preflight(
        self: Arc<Self>,
        policy: VersionPolicy,
        version: String,
        store_at: Option<Timestamp>,
    ) {
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let crd = policy.spec.crd_name.clone();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let reference = policy.object_ref(&());
        let key = preflight_key(&crd, &version);
        let ahead = store_at
            .filter(|at| *at > self.now())
            .map(|at| format!(" ahead of the {version} store at {at}"))
            .unwrap_or_default();
        let mut status = PreflightStatus {
            version: version.clone(),
            phase: MigrationPhase::Running,
            started_at: Some(Time(self.now())),
            finished_at: None,
            store_at: store_at.map(Time),
            read: 0,
            objects_digest: None,
            conversion: None,
            verified_at: None,
            failed: 0,
            failures: Vec::new(),
            message: Some(format!("reading every object of {crd} through {version}{ahead}")),
        };
        self.write_preflight(&name, &status).await;
        let note = format!("conversion preflight: reading every object of {crd} through {version}{ahead}");
        self.event(&reference, EventType::Normal, "PreflightStarted", note)
            .await;
        let settings = migrate::Settings {
            concurrency: usize::try_from(policy.spec.migration.concurrency).unwrap_or(16),
            page_size: policy.spec.migration.page_size,
            qps: policy.spec.migration.qps,
            mode: Mode::Preflight,
            through_version: Some(version.clone()),
            // The CRD converts through the operator's webhook: check what it produces
            // against the schema too (the apiserver prunes silently on read).
            preflight_conversion: policy.spec.conversion.clone().filter(|c| c.webhook.enabled),
            retry: self.retry.clone(),
            settle: self.settle.clone(),
            ..migrate::Settings::default()
        };
        let result = migrate::migrate(&self.client, &crd, &settings, &migrate::Quiet).await;
        status.finished_at = Some(Time(self.now()));
        let passed = match result {
            Ok(report) => {
                status.read = report.counts.rewritten;
                status.failed = report.counts.failed;
                status.failures = report.failures.iter().map(ToString::to_string).collect();
                status.message = Some(report.summary());
                status.objects_digest = report.objects_digest.clone();
                status.conversion = Some(report.target.conversion.clone());
                report.succeeded()
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
        self.write_preflight(&name, &status).await;
        let note = status.message.clone().unwrap_or_default();
        self.event(&reference, type_, reason, note).await;
        if passed {
            lock(&self.failed_at).remove(&key);
            lock(&self.passed_at).insert(key, Instant::now());
        } else {
            lock(&self.failed_at).insert(key, Instant::now());
        }
    }

    async fn write_preflight(&self, name: &str, status: &PreflightStatus) {
        let status = json!({"preflight": status});
        if let Err(error) = apply_status(&self.client, name, PREFLIGHT_FIELD_MANAGER, status).await {
            warn!(policy = name, error = %error, "cannot write the preflight status");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    fn passed(finished: &str) -> PreflightStatus {
        PreflightStatus {
            version: "v1".to_owned(),
            phase: MigrationPhase::Succeeded,
            started_at: Some(Time(at("2026-01-01T00:00:00Z"))),
            finished_at: Some(Time(at(finished))),
            store_at: None,
            read: 5000,
            objects_digest: Some("5000-00ff".to_owned()),
            conversion: Some("abc".to_owned()),
            verified_at: None,
            failed: 0,
            failures: Vec::new(),
            message: None,
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
    fn the_rate_is_read_from_the_last_preflight() {
        let status = passed("2026-01-01T00:00:10Z");
        assert_eq!(measured_rate(&status), Some(500.0));
        let mut running = status.clone();
        running.finished_at = None;
        assert_eq!(measured_rate(&running), None);
    }

    #[test]
    fn a_preflight_starts_at_its_lead_and_stands_until_its_conversion_changes() {
        let store = at("2026-01-01T01:00:00Z");
        let lead = Duration::from_secs(600);
        let need = |recorded: Option<&PreflightStatus>, conversion: &str, now: &str| {
            preflight_need(recorded, "v1", conversion, store, lead, 5000, at(now))
        };
        assert_eq!(need(None, "abc", "2026-01-01T00:49:00Z"), PreflightNeed::Nothing);
        assert_eq!(
            need(None, "abc", "2026-01-01T00:50:00Z"),
            PreflightNeed::Run { stale: false }
        );
        let done = passed("2026-01-01T00:51:00Z");
        assert_eq!(
            need(Some(&done), "abc", "2026-01-01T00:52:00Z"),
            PreflightNeed::Nothing
        );
        // Another version's result does not count.
        let mut other = done.clone();
        other.version = "v2".to_owned();
        assert_eq!(
            need(Some(&other), "abc", "2026-01-01T00:52:00Z"),
            PreflightNeed::Run { stale: false }
        );
        // The conversion changed: run again.
        assert_eq!(
            need(Some(&done), "xyz", "2026-01-01T00:52:00Z"),
            PreflightNeed::Run { stale: true }
        );
        // Shortly before the instant (10 s + 5 s for 5,000 objects): check the objects once.
        assert_eq!(
            need(Some(&done), "abc", "2026-01-01T00:59:44Z"),
            PreflightNeed::Nothing
        );
        assert_eq!(
            need(Some(&done), "abc", "2026-01-01T00:59:45Z"),
            PreflightNeed::Verify {
                digest: "5000-00ff".to_owned()
            }
        );
        let mut verified = done.clone();
        verified.verified_at = Some(Time(at("2026-01-01T00:59:46Z")));
        assert_eq!(
            need(Some(&verified), "abc", "2026-01-01T00:59:50Z"),
            PreflightNeed::Nothing
        );
        // A preflight that ended within the window needs no check.
        let late = passed("2026-01-01T00:59:50Z");
        assert_eq!(
            need(Some(&late), "abc", "2026-01-01T00:59:55Z"),
            PreflightNeed::Nothing
        );
        // One recorded as running (maybe by a controller that restarted since) is ensured:
        // `ensure_preflight` starts it only if it does not run here.
        let mut running = done.clone();
        running.phase = MigrationPhase::Running;
        assert_eq!(
            need(Some(&running), "abc", "2026-01-01T00:52:00Z"),
            PreflightNeed::Run { stale: false }
        );
        // A result without a digest (from before results had one) stands only if it ran
        // within the lead.
        let mut legacy = done.clone();
        legacy.objects_digest = None;
        assert_eq!(
            need(Some(&legacy), "abc", "2026-01-01T00:52:00Z"),
            PreflightNeed::Nothing
        );
        legacy.finished_at = Some(Time(at("2026-01-01T00:49:00Z")));
        assert_eq!(
            need(Some(&legacy), "abc", "2026-01-01T00:52:00Z"),
            PreflightNeed::Run { stale: true }
        );
        // A failed one is retried once it is time (the retry interval applies on top).
        let mut failed = done.clone();
        failed.phase = MigrationPhase::Failed;
        assert_eq!(
            need(Some(&failed), "abc", "2026-01-01T00:52:00Z"),
            PreflightNeed::Run { stale: false }
        );
    }
}
