use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

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
