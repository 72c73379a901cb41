//! `migrate`: one migration of a CRD, from reading it to the trim, started over while its
//! storage version changes under it: the permission check, the checkpoint's validity, the
//! storage guard, the settle check, the run, and the trim.

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::Client;
use tracing::{info, warn};

use super::crd_reads::read_target;
use super::discovery::{self, Expect};
use super::permissions::check_permissions;
use super::requests::Requester;
use super::run::Run;
use super::trim::{TrimResult, trim};
use super::{
    Counts, Error, GuardStart, Mode, Observer, Outcome, Report, Resume, Settings, StorageGuard, Target,
    Verdict,
};

/// Migrates a CRD's objects into its storage version (or, in `Mode::Preflight`, reads them
/// all through it) and reports.
pub async fn migrate(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
    observer: &dyn Observer,
) -> Result<Report, Error> {
    let started = Instant::now();
    let limiter = rate_limiter(settings.qps);
    let requester = Requester::throttled(client, limiter.as_ref(), settings.request_timeout);

    let mut restarts = 0;
    let mut expired_tokens = 0;
    let mut resume = settings.resume.clone();
    let mut permitted = false;
    loop {
        let mut target = read_target(client, crd_name, preflight_through(settings), settings).await?;
        if settings.mode == Mode::Rewrite
            && target.stale_versions().is_empty()
            && !target.stored_versions.is_empty()
        {
            let report = already_migrated(target, settings, restarts, expired_tokens, started);
            return Ok(report);
        }
        // Before touching any object: may this caller do what the run needs?
        if !permitted {
            check_permissions(client, crd_name, settings).await?;
            permitted = true;
        }
        drop_checkpoint_of_another_state(&mut resume, &target, crd_name, settings, observer);
        let guard =
            watch_storage_until_trim(client, &mut resume, &mut target, crd_name, settings, observer).await;
        let expect = settle_expectations(&target, settings);
        info!(crd = crd_name, storage = %target.storage_version, mode = ?settings.mode, "migration started");
        // Nothing is listed before the settle check passed (`Run::all_objects` says why).
        let settle_wait = settle(&requester, &target, expect, settings).await?;
        let run = Run {
            requester: &requester,
            target: &target,
            settings,
            observer,
            failures: Mutex::new(Vec::new()),
            converter: run_converter(settings),
            preflight_schema: preflight_schema(&target, settings),
        };
        let pass = run.all_objects(resume.take()).await?;
        restarts += pass.restarts;
        expired_tokens += pass.expired_tokens;
        let counts = pass.counts;
        let failures = run.failures.into_inner().unwrap_or_else(|p| p.into_inner());
        let report = |outcome| Report {
            target: target.clone(),
            mode: settings.mode,
            outcome,
            counts,
            failures: failures.clone(),
            restarts,
            expired_tokens,
            dry_run: settings.managed_fields.dry_run,
            elapsed: started.elapsed(),
            settle_wait,
            objects_digest: pass.digest.map(|d| d.value()),
            checked_objects: pass.checked.clone(),
        };
        match how_the_run_ends(&requester, &target, guard.as_ref(), counts, crd_name, settings).await? {
            AfterThePass::Ends(outcome) => return Ok(report(outcome)),
            AfterThePass::StartsOver(why) => {
                start_over_after_a_storage_change(&mut restarts, &why, crd_name, settings, observer)?;
            }
        }
    }
}

/// Evenly spaced requests, no bursts: `qps` is a ceiling for every second (none at 0).
fn rate_limiter(qps: u32) -> Option<DefaultDirectRateLimiter> {
    NonZeroU32::new(qps).map(|qps| RateLimiter::direct(Quota::per_second(qps).allow_burst(NonZeroU32::MIN)))
}

/// The version a preflight reads the objects through (`Settings::through_version`); other
/// runs read through the storage version.
fn preflight_through(settings: &Settings) -> Option<&str> {
    settings
        .through_version
        .as_deref()
        .filter(|_| settings.mode == Mode::Preflight)
}

/// What follows a pass that went over every object: the run ends with its outcome, or
/// starts over.
enum AfterThePass {
    Ends(Outcome),
    /// The storage version changed during the run (the trim's guard says how): it starts
    /// over.
    StartsOver(String),
}

/// The outcome of a run whose pass went over every object: failed, done (a preflight, a
/// cleanup), or, for a rewrite, its trim.
async fn how_the_run_ends(
    requester: &Requester<'_>,
    target: &Target,
    guard: Option<&StorageGuard>,
    counts: Counts,
    crd_name: &str,
    settings: &Settings,
) -> Result<AfterThePass, Error> {
    if counts.failed > 0 {
        return Ok(AfterThePass::Ends(Outcome::Failed));
    }
    match settings.mode {
        Mode::Preflight => return Ok(AfterThePass::Ends(Outcome::PreflightPassed)),
        Mode::CleanManagedFields => return Ok(AfterThePass::Ends(Outcome::ManagedFieldsCleaned)),
        Mode::Rewrite => {}
    }
    // Always there in this mode: a trim without the CRD's history is not made.
    let Some(guard) = guard else {
        return Err(Error::Unmigratable {
            crd: crd_name.to_owned(),
            reason: "a rewrite without a watch of its CRD cannot trim".to_owned(),
        });
    };
    // The settle check before the writes confirmed the CRD at the resourceVersion read.
    Ok(
        match trim(
            requester,
            target,
            guard,
            settings,
            target.resource_version.clone(),
        )
        .await?
        {
            TrimResult::Trimmed(previous) => AfterThePass::Ends(Outcome::Trimmed { previous }),
            TrimResult::NotTrimmed(reason) => AfterThePass::Ends(Outcome::NotTrimmed { reason }),
            TrimResult::StorageChanged(why) => AfterThePass::StartsOver(why),
        },
    )
}

/// The report of a rewrite with nothing to do: no version but the storage version is stored.
fn already_migrated(
    target: Target,
    settings: &Settings,
    restarts: usize,
    expired_tokens: usize,
    started: Instant,
) -> Report {
    Report {
        target,
        mode: settings.mode,
        outcome: Outcome::AlreadyMigrated,
        counts: Counts::default(),
        failures: Vec::new(),
        restarts,
        expired_tokens,
        dry_run: settings.managed_fields.dry_run,
        elapsed: started.elapsed(),
        settle_wait: Duration::ZERO,
        objects_digest: None,
        checked_objects: None,
    }
}

/// Drops `resume` (and says why) unless its checkpoint belongs to the CRD as `target` read
/// it.
fn drop_checkpoint_of_another_state(
    resume: &mut Option<Resume>,
    target: &Target,
    crd_name: &str,
    settings: &Settings,
    observer: &dyn Observer,
) {
    // A checkpoint is only valid for the CRD it was taken from. A managedFields cleanup's
    // also only at the generation it started at: a spec change since may have served a
    // version it cleans again, and clients may have named it again in objects already
    // passed (a rewrite's guard replays its history instead, below).
    if let Some(previous) = resume.take_if(|r| {
        r.storage_version != target.storage_version
            || (!r.conversion.is_empty() && r.conversion != target.conversion)
            || (settings.mode == Mode::CleanManagedFields && r.crd_generation != target.generation)
    }) {
        let reason = if settings.mode == Mode::CleanManagedFields
            && previous.storage_version == target.storage_version
            && (previous.conversion.is_empty() || previous.conversion == target.conversion)
        {
            format!(
                "the CRD's generation moved since the checkpoint ({:?}, now {:?}): a version it cleans may have been \
                 served again; starting a fresh run",
                previous.crd_generation, target.generation
            )
        } else {
            format!(
                "the CRD's storage version or conversion changed since the checkpoint (storing {}, now {}); starting a fresh run",
                previous.storage_version, target.storage_version
            )
        };
        warn!(crd = crd_name, "{reason}");
        observer.restarted(&reason);
    }
}

/// A rewrite's storage guard (`None` in the other modes), recorded in `target` as where its
/// watch starts; drops `resume` (and says why) when the guard cannot vouch for its
/// checkpoint.
async fn watch_storage_until_trim(
    client: &Client,
    resume: &mut Option<Resume>,
    target: &mut Target,
    crd_name: &str,
    settings: &Settings,
    observer: &dyn Observer,
) -> Option<StorageGuard> {
    // A rewrite watches the CRD until its trim (`StorageGuard`), from the state the run
    // it continues started at: a storage change while no one watched (a failover) is
    // replayed, or, if its history is gone, the generation decides.
    let mut guard = None;
    if settings.mode == Mode::Rewrite {
        let (started, why_fresh) = resumed_guard(client, resume, target, settings).await;
        if let Some(reason) = why_fresh {
            *resume = None;
            let reason = format!("{reason}; starting a fresh run");
            warn!(crd = crd_name, "{reason}");
            observer.restarted(&reason);
        }
        let started = started.unwrap_or_else(|| {
            StorageGuard::start(client, crd_name, GuardStart::of(target), settings.history_wait)
        });
        target.watched_from = Some(started.started_from().clone());
        guard = Some(started);
    }
    guard
}

/// What discovery must show, several answers in a row, before the run lists its first
/// object.
fn settle_expectations<'a>(target: &Target, settings: &'a Settings) -> Vec<Expect<'a>> {
    // Only rewrite once the apiserver answering re-encodes into the storage version; a
    // preflight only reads through a version the apiserver already serves.
    // A managedFields cleanup writes entries through the long-served storage version,
    // but an HA peer that has not seen the unserve would still accept a server-side
    // apply through the old version after its objects were cleaned (adding entries that
    // name it again): its pass starts once every apiserver answering has stopped
    // serving each (unserved) version it cleans, with the same settle rule.
    match settings.mode {
        Mode::Rewrite => vec![Expect::Storage],
        Mode::Preflight => vec![Expect::Served],
        Mode::CleanManagedFields => settings
            .managed_fields
            .versions
            .iter()
            .flatten()
            // Versions the CRD no longer serves, or no longer has (cleaning a served one
            // is the caller's choice: nothing to wait for).
            .filter(|v| !target.served.contains(v))
            .map(|v| Expect::Unserved(v))
            .collect(),
    }
}

/// Waits until discovery shows what each of `expect` asks (the settle check); how long that
/// took.
async fn settle(
    requester: &Requester<'_>,
    target: &Target,
    expect: Vec<Expect<'_>>,
    settings: &Settings,
) -> Result<Duration, Error> {
    let settling = Instant::now();
    for expect in expect {
        discovery::wait(requester, target, expect, &settings.settle).await?;
    }
    Ok(settling.elapsed())
}

/// The conversion a run converts with: the policy's, to translate a cleanup's field paths;
/// the one the webhook serves, for a preflight; none for a rewrite.
fn run_converter(settings: &Settings) -> Option<crate::conversion::Converter> {
    match settings.mode {
        Mode::CleanManagedFields => settings.managed_fields.conversion.as_ref(),
        Mode::Preflight => settings.preflight_conversion.as_ref(),
        Mode::Rewrite => None,
    }
    .and_then(|spec| crate::conversion::Converter::for_spec(spec).ok())
}

/// The schema a preflight with a conversion checks each converted object against.
fn preflight_schema(target: &Target, settings: &Settings) -> Option<crate::schema::Schema> {
    target
        .schemas
        .get(&target.version)
        .filter(|_| settings.mode == Mode::Preflight && settings.preflight_conversion.is_some())
        .map(crate::schema::Schema::parse)
}

/// Counts a restart after the storage version changed during the run, or gives up past
/// `max_restarts`.
fn start_over_after_a_storage_change(
    restarts: &mut usize,
    why: &str,
    crd_name: &str,
    settings: &Settings,
    observer: &dyn Observer,
) -> Result<(), Error> {
    *restarts += 1;
    if *restarts > settings.max_restarts {
        return Err(Error::TooManyRestarts {
            crd: crd_name.to_owned(),
            restarts: *restarts,
        });
    }
    let reason = format!("{why}; starting over");
    warn!(crd = crd_name, "{reason}");
    observer.restarted(&reason);
    Ok(())
}

/// The guard of a resumed rewrite, started from the state the interrupted run started at,
/// or why the run must start afresh instead (the checkpoint's history shows a storage change
/// or cannot be told: the objects before the checkpoint may have been written in another
/// version meanwhile). `(None, None)`: not a resume.
async fn resumed_guard(
    client: &Client,
    resume: &Option<Resume>,
    target: &Target,
    settings: &Settings,
) -> (Option<StorageGuard>, Option<String>) {
    let Some(resume) = resume else {
        return (None, None);
    };
    let Some(resource_version) = resume.crd_resource_version.clone() else {
        // A checkpoint from before the guard: only the generation can tell.
        if resume.crd_generation.is_some() && resume.crd_generation == target.generation {
            return (None, None);
        }
        let generation = |g: Option<i64>| g.map_or_else(|| "unknown".to_owned(), |g| g.to_string());
        return (
            None,
            Some(format!(
                "the checkpoint does not say which state of the CRD it belongs to, and the CRD's generation moved from {} to {} since",
                generation(resume.crd_generation),
                generation(target.generation)
            )),
        );
    };
    let start = GuardStart {
        resource_version,
        generation: resume.crd_generation,
        storage_version: resume.storage_version.clone(),
    };
    let guard = StorageGuard::start(client, &target.crd, start, settings.history_wait);
    match guard.check(target).await {
        Verdict::Unchanged => (Some(guard), None),
        Verdict::Changed(why) => (None, Some(format!("since the checkpoint's run started, {why}"))),
    }
}
