//! The storage-version migrator: rewrites every object of a CRD through the apiserver (and
//! so through its conversion webhook) into the storage version, then trims the CRD's
//! `status.storedVersions` to that version.
//!
//! A rewrite's memory is bounded by the page size and the concurrency, whatever the number
//! of objects: objects are listed metadata-only, a page at a time, and processed by a
//! bounded pool of requests while the next page is fetched. Progress is checkpointed per
//! page (the continue token after the last page whose objects are all done), so a run can
//! resume. A conversion preflight is the exception: it remembers 16 bytes per object it
//! found fit (`CheckedObjects`, about 50 MB for a million objects with the map's overhead),
//! so that its check shortly before the store reads only what changed since.
//!
//! A rewrite watches its CRD from start to trim (`StorageGuard`): `status.storedVersions` is
//! trimmed only if every state of the CRD since the run started (since the interrupted run
//! started, for a resumed one) had the run's storage version.

mod apiserver_clock;
pub mod builtin;
mod checked;
pub mod command;
mod digest;
mod discovery;
mod lister;
pub mod managed_fields;
pub mod permissions;
mod progress;
mod report;
mod requests;
mod run;
mod settings;
mod storage_guard;
mod target;
mod trim;

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use backon::Retryable;
use governor::{Quota, RateLimiter};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use tracing::{info, warn};

pub use checked::CheckedObjects;
pub use digest::ObjectsDigest;
pub use discovery::{SettleCheck, storage_version_hash};
pub use lister::{Collection, Folded, ListSettings, Listed, Lister};
pub use progress::{Checkpoint, Counts, ObjectResult, Observer, PageTracker, Quiet, Rate, Resume};
pub use report::{Failure, Outcome, Report};
pub use requests::{Answer, ObjectKey, Page};
pub use settings::{ManagedFieldsCleanup, Mode, RetryPolicy, Settings};
pub use storage_guard::{GuardStart, StorageGuard, Verdict};
pub use target::{Target, conversion_fingerprint};

use discovery::Expect;
use requests::Requester;
use run::Run;
use trim::{TrimResult, trim};

/// Failures that stop a run before it can report per-object results.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CustomResourceDefinition {0} not found")]
    CrdNotFound(String),
    #[error("cannot migrate {crd}: {reason}")]
    Unmigratable { crd: String, reason: String },
    #[error("listing {crd} through {version} failed: {message}")]
    List {
        crd: String,
        version: String,
        message: String,
    },
    #[error("the storage version of {crd} kept changing; gave up after {restarts} restarts")]
    TooManyRestarts { crd: String, restarts: usize },
    #[error("the apiserver was not yet {what} for {crd} after {waited:?} ({last})")]
    NotSettled {
        crd: String,
        what: String,
        waited: Duration,
        last: String,
    },
    #[error("apiserver request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("{what}: no answer within {after:?}")]
    Timeout { what: String, after: Duration },
    /// The caller may not do what the run needs (nothing was touched).
    #[error("{0}")]
    MissingPermission(String),
}

impl Error {
    /// Short stable label, for metrics and event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Error::CrdNotFound(_) => "crd_not_found",
            Error::Unmigratable { .. } => "unmigratable",
            Error::List { .. } => "list",
            Error::TooManyRestarts { .. } => "too_many_restarts",
            Error::NotSettled { .. } => "not_settled",
            Error::Kube(_) => "kube",
            Error::Timeout { .. } => "timeout",
            Error::MissingPermission(_) => "missing_permission",
        }
    }

    /// Worth trying again: a timeout, a failed connection, 429 or 5xx.
    fn is_transient(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Kube(kube::Error::Api(status)) => status.code == 429 || status.code >= 500,
            Error::Kube(kube::Error::HyperError(_) | kube::Error::Service(_)) => true,
            _ => false,
        }
    }
}

/// Migrates a CRD's objects into its storage version (or, in `Mode::Preflight`, reads them
/// all through it) and reports.
pub async fn migrate(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
    observer: &dyn Observer,
) -> Result<Report, Error> {
    let started = Instant::now();
    // Evenly spaced requests, no bursts: `qps` is a ceiling for every second.
    let limiter = NonZeroU32::new(settings.qps)
        .map(|qps| RateLimiter::direct(Quota::per_second(qps).allow_burst(NonZeroU32::MIN)));
    let requester = Requester {
        client,
        limiter: limiter.as_ref(),
        timeout: settings.request_timeout,
    };

    let mut restarts = 0;
    let mut expired_tokens = 0;
    let mut resume = settings.resume.clone();
    let mut permitted = false;
    loop {
        let through = settings
            .through_version
            .as_deref()
            .filter(|_| settings.mode == Mode::Preflight);
        let mut target = read_target(client, crd_name, through, settings).await?;
        if settings.mode == Mode::Rewrite
            && target.stale_versions().is_empty()
            && !target.stored_versions.is_empty()
        {
            return Ok(Report {
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
            });
        }
        // Before touching any object: may this caller do what the run needs?
        if !permitted {
            check_permissions(client, crd_name, settings).await?;
            permitted = true;
        }
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
        // A rewrite watches the CRD until its trim (`StorageGuard`), from the state the run
        // it continues started at: a storage change while no one watched (a failover) is
        // replayed, or, if its history is gone, the generation decides.
        let mut guard = None;
        if settings.mode == Mode::Rewrite {
            let (started, why_fresh) = resumed_guard(client, &resume, &target, settings).await;
            if let Some(reason) = why_fresh {
                resume = None;
                let reason = format!("{reason}; starting a fresh run");
                warn!(crd = crd_name, "{reason}");
                observer.restarted(&reason);
            }
            let started = started.unwrap_or_else(|| {
                StorageGuard::start(client, crd_name, GuardStart::of(&target), settings.history_wait)
            });
            target.watched_from = Some(started.started_from().clone());
            guard = Some(started);
        }
        // Only rewrite once the apiserver answering re-encodes into the storage version; a
        // preflight only reads through a version the apiserver already serves.
        // A managedFields cleanup writes entries through the long-served storage version,
        // but an HA peer that has not seen the unserve would still accept a server-side
        // apply through the old version after its objects were cleaned (adding entries that
        // name it again): its pass starts once every apiserver answering has stopped
        // serving each (unserved) version it cleans, with the same settle rule.
        let expect: Vec<Expect> = match settings.mode {
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
        };
        info!(crd = crd_name, storage = %target.storage_version, mode = ?settings.mode, "migration started");
        // Nothing is listed before the settle check passed (`Run::all_objects` says why).
        let settling = Instant::now();
        for expect in expect {
            discovery::wait(&requester, &target, expect, &settings.settle).await?;
        }
        let settle_wait = settling.elapsed();
        let run = Run {
            requester: &requester,
            target: &target,
            settings,
            observer,
            failures: Mutex::new(Vec::new()),
            converter: match settings.mode {
                Mode::CleanManagedFields => settings.managed_fields.conversion.as_ref(),
                Mode::Preflight => settings.preflight_conversion.as_ref(),
                Mode::Rewrite => None,
            }
            .and_then(|spec| crate::conversion::Converter::for_spec(spec).ok()),
            preflight_schema: target
                .schemas
                .get(&target.version)
                .filter(|_| settings.mode == Mode::Preflight && settings.preflight_conversion.is_some())
                .map(crate::schema::Schema::parse),
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
        if counts.failed > 0 {
            return Ok(report(Outcome::Failed));
        }
        match settings.mode {
            Mode::Preflight => return Ok(report(Outcome::PreflightPassed)),
            Mode::CleanManagedFields => return Ok(report(Outcome::ManagedFieldsCleaned)),
            Mode::Rewrite => {}
        }
        // Always there in this mode: a trim without the CRD's history is not made.
        let Some(guard) = guard.as_ref() else {
            return Err(Error::Unmigratable {
                crd: crd_name.to_owned(),
                reason: "a rewrite without a watch of its CRD cannot trim".to_owned(),
            });
        };
        // The settle check before the writes confirmed the CRD at the resourceVersion read.
        match trim(
            &requester,
            &target,
            guard,
            settings,
            target.resource_version.clone(),
        )
        .await?
        {
            TrimResult::Trimmed(previous) => return Ok(report(Outcome::Trimmed { previous })),
            TrimResult::NotTrimmed(reason) => return Ok(report(Outcome::NotTrimmed { reason })),
            TrimResult::StorageChanged(why) => {
                restarts += 1;
                if restarts > settings.max_restarts {
                    return Err(Error::TooManyRestarts {
                        crd: crd_name.to_owned(),
                        restarts,
                    });
                }
                let reason = format!("{why}; starting over");
                warn!(crd = crd_name, "{reason}");
                observer.restarted(&reason);
            }
        }
    }
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

/// Runs a request to the apiserver made with kube's typed API: bounded by the request
/// timeout, retried while it fails transiently.
async fn kube_request<T, F, Fut>(settings: &Settings, what: &str, request: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut request = request;
    let timeout = settings.request_timeout;
    let bounded = || {
        let pending = request();
        async move {
            tokio::time::timeout(timeout, pending)
                .await
                .map_err(|_| Error::Timeout {
                    what: what.to_owned(),
                    after: timeout,
                })?
                .map_err(Error::from)
        }
    };
    bounded
        .retry(settings.retry.backoff())
        .sleep(tokio::time::sleep)
        .when(Error::is_transient)
        .notify(|error, wait| warn!(error = %error, "{what} failed; retrying in {wait:?}"))
        .await
}

/// Fails with `Error::MissingPermission`, naming every missing verb and the ClusterRole
/// that grants them, unless the caller may do everything the run needs.
async fn check_permissions(client: &Client, crd_name: &str, settings: &Settings) -> Result<(), Error> {
    let needed = permissions::required(
        crd_name,
        settings.mode,
        settings.through_status,
        settings.managed_fields.dry_run,
    );
    let missing = kube_request(settings, "checking permissions", || {
        permissions::missing(client, &needed)
    })
    .await?;
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::MissingPermission(permissions::missing_message(
        crd_name,
        &missing,
        settings.through_status,
    )))
}

/// The CRD, and the apiserver's clock when it was read.
async fn read_crd(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
) -> Result<apiserver_clock::Dated<CustomResourceDefinition>, Error> {
    let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}");
    kube_request(
        settings,
        &format!("reading CustomResourceDefinition {crd_name}"),
        || apiserver_clock::get(client, &path),
    )
    .await?
    .ok_or_else(|| Error::CrdNotFound(crd_name.to_owned()))
}

/// The CRD as it is now, as a target through its storage version.
async fn read_current(client: &Client, crd_name: &str, settings: &Settings) -> Result<Target, Error> {
    let read = read_crd(client, crd_name, settings).await?;
    let mut target = Target::from_crd(&read.value).map_err(|reason| Error::Unmigratable {
        crd: crd_name.to_owned(),
        reason,
    })?;
    target.read_at = read.date;
    Ok(target)
}

/// The CRD as it is now, once discovery confirms that the apiservers answering store in its
/// storage version (the settle check, docs/src/internals/architecture.md): what another migrator (Kubernetes'
/// built-in one, which has no settle of its own) may be started for. Its rewrites go through
/// any apiserver, and one that has not acted on the switch yet encodes in the old version.
pub async fn settled_target(client: &Client, crd_name: &str, settings: &Settings) -> Result<Target, Error> {
    let requester = Requester::unthrottled(client, settings.request_timeout);
    let target = read_current(client, crd_name, settings).await?;
    discovery::wait(&requester, &target, Expect::Storage, &settings.settle).await?;
    Ok(target)
}

/// After another migrator (Kubernetes' built-in one) rewrote every object: trims
/// `status.storedVersions` to the storage version with the same guards as a run's last step.
/// `guard` watches the CRD from the state the migration was created for (its storage version
/// is the one the objects were migrated into); `stored_versions` and `conversion` are what
/// the CRD had then. Nothing is trimmed if the storage version changed since (objects may
/// have been written in another version), if the conversion changed, or unless the storage
/// version is confirmed through discovery at the resourceVersion the trim is made at.
/// `Trimmed` (empty `previous` if it already was) or `NotTrimmed` with the reason.
pub async fn trim_after(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
    guard: &StorageGuard,
    stored_versions: &[String],
    conversion: &str,
) -> Result<Outcome, Error> {
    let requester = Requester::unthrottled(client, settings.request_timeout);
    let mut target = read_current(client, crd_name, settings).await?;
    // What the migration was created for, not what the CRD says now.
    target.storage_version = guard.started_from().storage_version.clone();
    target.stored_versions = stored_versions.to_vec();
    target.conversion = conversion.to_owned();
    Ok(match trim(&requester, &target, guard, settings, None).await? {
        TrimResult::Trimmed(previous) => Outcome::Trimmed { previous },
        TrimResult::NotTrimmed(reason) => Outcome::NotTrimmed { reason },
        TrimResult::StorageChanged(why) => Outcome::NotTrimmed {
            reason: format!("{why} since the migration was created"),
        },
    })
}

/// How many objects the CRD has (one list of a single object, whose
/// `remainingItemCount` gives the rest, sample 30, retried while it fails transiently);
/// `None` when the apiserver does not say.
pub async fn count_objects(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
) -> Result<Option<u64>, Error> {
    let requester = Requester::unthrottled(client, settings.request_timeout);
    let target = read_target(client, crd_name, None, settings).await?;
    requests::retried(
        &settings.retry,
        &format!("counting the objects of {crd_name}"),
        || requester.count(&target),
    )
    .await
    .map_err(|answer| listing_failed(&target, &answer))
}

/// A digest of the CRD's objects as they are now (one metadata-only listing through the
/// storage version), to compare with `Report::objects_digest` of an earlier run.
pub async fn objects_digest(client: &Client, crd_name: &str, settings: &Settings) -> Result<String, Error> {
    let target = read_target(client, crd_name, None, settings).await?;
    let lister = Lister::new(client, Collection::from(&target), ListSettings::from(settings));
    digest::list_digest(&lister).await.map(|d| d.value())
}

fn listing_failed(target: &Target, answer: &Answer) -> Error {
    Error::List {
        crd: target.crd.clone(),
        version: target.version.clone(),
        message: answer.to_string(),
    }
}

async fn read_target(
    client: &Client,
    crd_name: &str,
    through: Option<&str>,
    settings: &Settings,
) -> Result<Target, Error> {
    let read = read_crd(client, crd_name, settings).await?;
    let crd = &read.value;
    let unmigratable = |reason| Error::Unmigratable {
        crd: crd_name.to_owned(),
        reason,
    };
    let mut target = Target::from_crd(crd).map_err(unmigratable)?;
    target.read_at = read.date;
    if settings.through_status && settings.mode == Mode::Rewrite {
        target = target.through_status(crd).map_err(unmigratable)?;
    }
    match through {
        Some(version) => target.through(crd, version).map_err(unmigratable),
        None => Ok(target),
    }
}
