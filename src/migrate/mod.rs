//! The storage-version migrator: rewrites every object of a CRD through the apiserver (and
//! so through its conversion webhook) into the storage version, then trims the CRD's
//! `status.storedVersions` to that version.
//!
//! Memory is bounded by the page size and the concurrency, whatever the number of objects:
//! objects are listed metadata-only, a page at a time, and processed by a bounded pool of
//! requests while the next page is fetched. Progress is checkpointed per page (the continue
//! token after the last page whose objects are all done), so a run can resume.

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
mod target;
mod trim;

use futures::FutureExt as _;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use backon::Retryable;
use governor::{Quota, RateLimiter};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::Api;
use tracing::{info, warn};

pub use checked::CheckedObjects;
pub use digest::ObjectsDigest;
pub use discovery::{SettleCheck, storage_version_hash};
pub use lister::{Collection, Folded, ListSettings, Listed, Lister};
pub use progress::{Checkpoint, Counts, ObjectResult, Observer, PageTracker, Quiet, Rate, Resume};
pub use report::{Failure, Outcome, Report};
pub use requests::{Answer, ObjectKey, Page};
pub use settings::{ManagedFieldsCleanup, Mode, RetryPolicy, Settings};
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
        let target = read_target(client, crd_name, through, settings).await?;
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
                objects_digest: None,
                checked_objects: None,
            });
        }
        // Before touching any object: may this caller do what the run needs?
        if !permitted {
            check_permissions(client, crd_name, settings).await?;
            permitted = true;
        }
        // A checkpoint is only valid for the CRD it was taken from.
        if let Some(previous) = resume.take_if(|r| {
            r.storage_version != target.storage_version
                || (!r.conversion.is_empty() && r.conversion != target.conversion)
        }) {
            let reason = format!(
                "the CRD's storage version or conversion changed since the checkpoint (storing {}, now {}); starting a fresh run",
                previous.storage_version, target.storage_version
            );
            warn!(crd = crd_name, "{reason}");
            observer.restarted(&reason);
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
                // Versions the CRD no longer serves (cleaning a served one is the caller's
                // choice: nothing to wait for).
                .filter(|v| !target.served.contains(v))
                .filter_map(|v| target.versions.iter().position(|known| known == v))
                .map(Expect::Unserved)
                .collect(),
        };
        // Reads are safe before the settle check: it runs while the first page is listed,
        // and only the first write (or read through a new version) waits for it.
        let settle = async {
            for expect in expect {
                discovery::wait(&requester, &target, expect, &settings.settle).await?;
            }
            Ok(())
        };
        info!(crd = crd_name, storage = %target.storage_version, mode = ?settings.mode, "migration started");
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
        let pass = run.all_objects(resume.take(), settle.boxed()).await?;
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
        match trim(&requester, &target, settings, true).await? {
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

async fn read_crd(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
) -> Result<CustomResourceDefinition, Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    kube_request(
        settings,
        &format!("reading CustomResourceDefinition {crd_name}"),
        || crds.get_opt(crd_name),
    )
    .await?
    .ok_or_else(|| Error::CrdNotFound(crd_name.to_owned()))
}

/// After another migrator (Kubernetes' built-in one) rewrote every object: trims
/// `status.storedVersions` to the storage version with the same guards as a run's last step
/// (the storage version confirmed through discovery, the CRD unchanged meanwhile, a
/// resourceVersion precondition). `Trimmed` (empty `previous` if it already was) or
/// `NotTrimmed` with the reason.
pub async fn trim_after(client: &Client, crd_name: &str, settings: &Settings) -> Result<Outcome, Error> {
    let requester = Requester::unthrottled(client, settings.request_timeout);
    let target = read_target(client, crd_name, None, settings).await?;
    Ok(match trim(&requester, &target, settings, false).await? {
        TrimResult::Trimmed(previous) => Outcome::Trimmed { previous },
        TrimResult::NotTrimmed(reason) => Outcome::NotTrimmed { reason },
        TrimResult::StorageChanged(why) => Outcome::NotTrimmed {
            reason: format!("{why} meanwhile"),
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
    let crd = read_crd(client, crd_name, settings).await?;
    let unmigratable = |reason| Error::Unmigratable {
        crd: crd_name.to_owned(),
        reason,
    };
    let mut target = Target::from_crd(&crd).map_err(unmigratable)?;
    if settings.through_status && settings.mode == Mode::Rewrite {
        target = target.through_status(&crd).map_err(unmigratable)?;
    }
    match through {
        Some(version) => target.through(&crd, version).map_err(unmigratable),
        None => Ok(target),
    }
}
