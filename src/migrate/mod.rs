//! The storage-version migrator: rewrites every object of a CRD through the apiserver (and
//! so through its conversion webhook) into the storage version, then trims the CRD's
//! `status.storedVersions` to that version.
//!
//! Memory is bounded by the page size and the concurrency, whatever the number of objects:
//! objects are listed metadata-only, a page at a time, and processed by a bounded pool of
//! requests while the next page is fetched. Progress is checkpointed per page (the continue
//! token after the last page whose objects are all done), so a run can resume.

pub mod command;
mod discovery;
pub mod managed_fields;
mod progress;

mod requests;
mod target;

use crate::sync::lock;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;

use std::collections::VecDeque;

use backon::{ExponentialBuilder, Retryable};
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use governor::{Quota, RateLimiter};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

pub use discovery::{SettleCheck, storage_version_hash};
pub use progress::{Checkpoint, Counts, ObjectResult, Observer, PageTracker, Quiet, Rate, Resume};
pub use requests::{Answer, ObjectKey};
pub use target::Target;

use discovery::Expect;
use requests::Requester;

/// What to do with each object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Rewrite it into the storage version, then trim `status.storedVersions`.
    Rewrite,
    /// Only read it through the storage version (conversion preflight); write nothing.
    Preflight,
    /// Rewrite the `metadata.managedFields` entries that name stale versions so that they
    /// name the storage version (see `Settings::managed_fields`); no trim.
    CleanManagedFields,
}

/// Which managedFields entries a `Mode::CleanManagedFields` run rewrites.
#[derive(Clone, Debug, Default)]
pub struct ManagedFieldsCleanup {
    /// The versions whose entries are rewritten (a version about to be removed); `None`:
    /// every version the CRD no longer has (repairing objects after a removal).
    pub versions: Option<Vec<String>>,
    /// The policy's declarative conversion, to translate the entries' field paths.
    pub conversion: Option<crate::api::ConversionSpec>,
    /// Count the objects that need a rewrite; write nothing.
    pub dry_run: bool,
}

/// How requests that may succeed later are retried: 5xx, 429 (after its `Retry-After`),
/// timeouts and connection failures, with exponential backoff and jitter.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts per request, the first included.
    pub attempts: u32,
    /// Wait before the first retry; doubled every retry.
    pub base_delay: Duration,
    /// Longest wait between retries.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 6,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.base_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.attempts.saturating_sub(1) as usize)
            .with_jitter()
    }
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Objects per list request.
    pub page_size: u32,
    /// Requests per second (lists and discovery included); 0 for no limit.
    pub qps: u32,
    pub mode: Mode,
    pub retry: RetryPolicy,
    /// Longest wait for one request's answer; a request that takes longer is retried.
    pub request_timeout: Duration,
    /// How the storage switch (or, for a preflight, the version being served) is confirmed
    /// through discovery before the first request and before the trim.
    pub settle: SettleCheck,
    /// Resume an interrupted run from its checkpoint; ignored (a fresh run starts) when the
    /// CRD changed since.
    pub resume: Option<Resume>,
    /// How many failures the report lists.
    pub max_reported_failures: usize,
    /// How often the whole run may start over because the storage version changed.
    pub max_restarts: usize,
    /// How many times in a row the continue token may expire without a page listed in
    /// between before the run gives up.
    pub max_expired_in_a_row: usize,
    /// With `Mode::Preflight`: read through this version instead of the storage version
    /// (the version a `store` is about to switch to).
    pub through_version: Option<String>,
    /// With `Mode::Rewrite`: send rewrites to the `/status` subresource.
    pub through_status: bool,
    /// With `Mode::CleanManagedFields`: which entries.
    pub managed_fields: ManagedFieldsCleanup,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            concurrency: 16,
            page_size: 500,
            qps: 0,
            mode: Mode::Rewrite,
            retry: RetryPolicy::default(),
            request_timeout: Duration::from_secs(60),
            settle: SettleCheck::default(),
            resume: None,
            max_reported_failures: 20,
            max_restarts: 3,
            max_expired_in_a_row: 10,
            through_version: None,
            through_status: false,
            managed_fields: ManagedFieldsCleanup::default(),
        }
    }
}

/// An object that could not be processed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub object: String,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every object is in the storage version and `status.storedVersions` was set to it
    /// alone (it listed `previous` before).
    Trimmed { previous: Vec<String> },
    /// `status.storedVersions` already listed only the storage version: nothing to do.
    AlreadyMigrated,
    /// Preflight: every object reads through the storage version.
    PreflightPassed,
    /// Some objects failed (see `failures`); `status.storedVersions` is untouched.
    Failed,
    /// Every object was rewritten but the CRD changed during the run, so
    /// `status.storedVersions` was left untouched.
    NotTrimmed { reason: String },
    /// No object's managedFields names a stale version any more.
    ManagedFieldsCleaned,
}

/// The result of a run.
#[derive(Clone, Debug)]
pub struct Report {
    pub target: Target,
    pub mode: Mode,
    pub outcome: Outcome,
    pub counts: Counts,
    /// The first failures (at most `max_reported_failures`).
    pub failures: Vec<Failure>,
    /// Listing passes that started over (changed storage version, an expired continue
    /// token without a fresh one).
    pub restarts: usize,
    /// Expired continue tokens (etcd compactions) the listing went on from.
    pub expired_tokens: usize,
    /// A managedFields cleanup that only counted (wrote nothing).
    pub dry_run: bool,
    pub elapsed: Duration,
}

impl Report {
    /// Whether the run did all it was asked to.
    pub fn succeeded(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::Trimmed { .. }
                | Outcome::AlreadyMigrated
                | Outcome::PreflightPassed
                | Outcome::ManagedFieldsCleaned
        )
    }

    /// One line for logs, events and status.
    pub fn summary(&self) -> String {
        let c = &self.counts;
        let counts = format!(
            "{} listed, {} {}, {} skipped, {} failed in {:.1}s",
            c.listed,
            c.rewritten,
            match self.mode {
                Mode::Preflight => "converted",
                Mode::CleanManagedFields if self.dry_run => "need a repair",
                Mode::CleanManagedFields => "repaired",
                Mode::Rewrite => "rewritten",
            },
            c.skipped,
            c.failed,
            self.elapsed.as_secs_f64()
        );
        let counts = match self.expired_tokens {
            0 => counts,
            n => format!("{counts}, going on after {n} expired continue tokens"),
        };
        let target = &self.target;
        match &self.outcome {
            Outcome::Trimmed { previous } => format!(
                "migrated {} to {}: {counts}; status.storedVersions trimmed from [{}] to [{}]",
                target.crd,
                target.storage_version,
                previous.join(", "),
                target.storage_version
            ),
            Outcome::AlreadyMigrated => format!(
                "{} needs no migration: status.storedVersions is already [{}]",
                target.crd, target.storage_version
            ),
            Outcome::PreflightPassed => format!(
                "preflight of {} through {}: every object converts ({counts})",
                target.crd, target.version
            ),
            Outcome::ManagedFieldsCleaned if self.dry_run => format!(
                "dry run, nothing written: managedFields of {}: {counts}",
                target.crd
            ),
            Outcome::ManagedFieldsCleaned => format!(
                "managedFields of {} name only versions it serves from now on: {counts}",
                target.crd
            ),
            Outcome::Failed => {
                let first: Vec<String> = self.failures.iter().take(3).map(ToString::to_string).collect();
                let what = match self.mode {
                    Mode::Rewrite => format!("migration of {} to {}", target.crd, target.version),
                    Mode::Preflight => format!("preflight of {} through {}", target.crd, target.version),
                    Mode::CleanManagedFields => format!("managedFields cleanup of {}", target.crd),
                };
                format!(
                    "{what} failed: {counts}; status.storedVersions left untouched; first failures: {}",
                    first.join("; ")
                )
            }
            Outcome::NotTrimmed { reason } => format!(
                "objects of {} rewritten to {} ({counts}) but status.storedVersions left untouched: {reason}",
                target.crd, target.storage_version
            ),
        }
    }
}

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
            });
        }
        // A checkpoint is only valid for the CRD it was taken from.
        if let Some(previous) = resume
            .take_if(|r| r.crd_generation != target.generation || r.storage_version != target.storage_version)
        {
            let reason = format!(
                "the CRD changed since the checkpoint (generation {} storing {}, now generation {} storing {}); starting a fresh run",
                previous.crd_generation.unwrap_or_default(),
                previous.storage_version,
                target.generation.unwrap_or_default(),
                target.storage_version
            );
            warn!(crd = crd_name, "{reason}");
            observer.restarted(&reason);
        }
        // Only rewrite once the apiserver answering re-encodes into the storage version; a
        // preflight only reads through a version the apiserver already serves.
        // A managedFields cleanup writes entries, not encodings, through the long-served
        // storage version: nothing to wait for.
        let expect = match settings.mode {
            Mode::Rewrite => Some(Expect::Storage),
            Mode::Preflight => Some(Expect::Served),
            Mode::CleanManagedFields => None,
        };
        if let Some(expect) = expect {
            discovery::wait(&requester, &target, expect, &settings.settle).await?;
        }
        info!(crd = crd_name, storage = %target.storage_version, mode = ?settings.mode, "migration started");
        let run = Run {
            requester: &requester,
            target: &target,
            settings,
            observer,
            failures: Mutex::new(Vec::new()),
            converter: match settings.mode {
                Mode::CleanManagedFields => settings
                    .managed_fields
                    .conversion
                    .as_ref()
                    .and_then(|spec| crate::conversion::Converter::for_spec(spec).ok()),
                Mode::Rewrite | Mode::Preflight => None,
            },
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
        };
        if counts.failed > 0 {
            return Ok(report(Outcome::Failed));
        }
        match settings.mode {
            Mode::Preflight => return Ok(report(Outcome::PreflightPassed)),
            Mode::CleanManagedFields => return Ok(report(Outcome::ManagedFieldsCleaned)),
            Mode::Rewrite => {}
        }
        match trim(&requester, &target, settings).await? {
            TrimResult::Trimmed(previous) => return Ok(report(Outcome::Trimmed { previous })),
            TrimResult::NotTrimmed(reason) => return Ok(report(Outcome::NotTrimmed { reason })),
            TrimResult::StorageChanged(now) => {
                restarts += 1;
                if restarts > settings.max_restarts {
                    return Err(Error::TooManyRestarts {
                        crd: crd_name.to_owned(),
                        restarts,
                    });
                }
                let reason = format!(
                    "the storage version changed from {} to {now}; starting over",
                    target.storage_version
                );
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

/// One run over the objects of one target.
struct Run<'a> {
    requester: &'a Requester<'a>,
    target: &'a Target,
    settings: &'a Settings,
    observer: &'a dyn Observer,
    failures: Mutex<Vec<Failure>>,
    /// With `Mode::CleanManagedFields`: the policy's conversion, to translate field paths
    /// (built once per run, not per object).
    converter: Option<crate::conversion::Converter>,
}

/// What became of one object.
enum Processed {
    Done,
    Skipped,
    Failed(String),
}

enum PassEnd {
    Finished,
    /// The continue token expired (410) and the apiserver gave no fresh one: list again
    /// from the start.
    Expired,
}

/// What the passes of one run did.
struct Passes {
    counts: Counts,
    restarts: usize,
    expired_tokens: usize,
}

impl Run<'_> {
    /// Every listing pass until one completes.
    async fn all_objects(&self, resume: Option<Resume>) -> Result<Passes, Error> {
        let mut passes = Passes {
            counts: Counts::default(),
            restarts: 0,
            expired_tokens: 0,
        };
        let mut token = None;
        if let Some(resume) = resume {
            passes.counts = resume.counts;
            token = Some(resume.continue_token);
        }
        loop {
            // The total for progress: metadata-only lists carry no remainingItemCount.
            let total = match self.with_retries(|| self.requester.count(self.target)).await {
                Ok(total) => total,
                Err(answer) => {
                    warn!(crd = %self.target.crd, "cannot count the objects: {}", describe(&answer));
                    None
                }
            };
            self.observer.started(self.target, &passes.counts);
            match self.pass(token.take(), &mut passes, total).await? {
                PassEnd::Finished => return Ok(passes),
                PassEnd::Expired => {
                    // Rewrites are idempotent: start the listing over (apiserver-samples/16).
                    passes.restarts += 1;
                    if passes.restarts > self.settings.max_restarts.max(1) * 4 {
                        return Err(self.list_error("the continue token kept expiring".to_owned()));
                    }
                    passes.counts = Counts::default();
                    lock(&self.failures).clear();
                    self.observer.restarted(
                        "the list continue token expired and the apiserver gave no fresh one; listing again from the start",
                    );
                }
            }
        }
    }

    /// One listing pass, from `start` (a continue token) to the last page. Objects are
    /// processed by at most `concurrency` requests at once; the next page is fetched while
    /// the current one's last objects are still in flight, so memory holds about one page.
    async fn pass(
        &self,
        start: Option<String>,
        passes: &mut Passes,
        mut total: Option<u64>,
    ) -> Result<PassEnd, Error> {
        let concurrency = self.settings.concurrency.max(1);
        let counts = &mut passes.counts;
        let mut tracker = PageTracker::new(*counts);
        let mut queue: VecDeque<(usize, ObjectKey)> = VecDeque::new();
        let mut in_flight = FuturesUnordered::new();
        // The page being fetched, the index of the next page, and its token once known
        // (`None` after the last page).
        let mut fetching: Option<BoxFuture<'_, Result<requests::Page, Answer>>> =
            Some(self.fetch(start).boxed());
        let mut next_index = 0usize;
        let mut next_token: Option<String> = None;
        let mut expired_in_a_row = 0;
        loop {
            while in_flight.len() < concurrency
                && let Some((page, key)) = queue.pop_front()
            {
                in_flight.push(self.process_object(page, key));
            }
            if fetching.is_none()
                && queue.len() < concurrency
                && let Some(token) = next_token.take()
            {
                fetching = Some(self.fetch(Some(token)).boxed());
            }
            if in_flight.is_empty() && fetching.is_none() {
                return Ok(PassEnd::Finished);
            }
            tokio::select! {
                Some((page, processed, key)) = in_flight.next(), if !in_flight.is_empty() => {
                    let result = match processed {
                        Processed::Done => ObjectResult::Rewritten,
                        Processed::Skipped => ObjectResult::Skipped,
                        Processed::Failed(message) => {
                            let mut failures = lock(&self.failures);
                            if failures.len() < self.settings.max_reported_failures {
                                failures.push(Failure { object: key.to_string(), message });
                            }
                            ObjectResult::Failed
                        }
                    };
                    counts.record(result);
                    self.observer.progress(counts, total);
                    if let Some((checkpoint, committed)) = tracker.done(page, result) {
                        self.observer.checkpoint(&checkpoint, &committed);
                    }
                }
                listed = async {
                    match fetching.as_mut() {
                        Some(page) => page.await,
                        None => std::future::pending().await,
                    }
                }, if fetching.is_some() => {
                    fetching = None;
                    let page = match listed {
                        Ok(page) => page,
                        // The continue token is older than the etcd compaction; the answer
                        // carries a fresh token that goes on from where the list stopped
                        // (samples 27, 28). Objects written meanwhile were encoded in the
                        // storage version by the apiserver anyway.
                        Err(Answer::Status { code: 410, continue_token: Some(fresh), .. }) => {
                            expired_in_a_row += 1;
                            passes.expired_tokens += 1;
                            if expired_in_a_row > self.settings.max_expired_in_a_row {
                                return Err(self.list_error(format!(
                                    "the continue token expired {expired_in_a_row} times in a row"
                                )));
                            }
                            self.observer.continued(
                                "the list continue token expired (etcd compaction); going on with the fresh token the apiserver gave",
                            );
                            if let Some((checkpoint, committed)) = tracker.replace_token(fresh.clone()) {
                                self.observer.checkpoint(&checkpoint, &committed);
                            }
                            fetching = Some(self.fetch(Some(fresh)).boxed());
                            continue;
                        }
                        // Expired without a fresh token (sample 16 has one; an older
                        // apiserver may not): only a new list is left.
                        Err(Answer::Status { code: 410, .. }) => return Ok(PassEnd::Expired),
                        Err(answer) => return Err(self.list_error(describe(&answer))),
                    };
                    expired_in_a_row = 0;
                    let index = next_index;
                    next_index += 1;
                    counts.listed += page.objects.len() as u64;
                    if total.is_none() && let Some(remaining) = page.remaining {
                        total = Some(counts.listed + remaining);
                    }
                    next_token = page.next.clone();
                    if let Some((checkpoint, committed)) = tracker.add(index, page.objects.len(), page.next) {
                        self.observer.checkpoint(&checkpoint, &committed);
                    }
                    queue.extend(page.objects.into_iter().map(|key| (index, key)));
                    self.observer.progress(counts, total);
                }
            }
        }
    }

    /// Lists one page, retrying what may succeed later; a 410 is returned at once (the
    /// caller follows its fresh token).
    async fn fetch(&self, token: Option<String>) -> Result<requests::Page, Answer> {
        self.with_retries(|| {
            self.requester.list_page(
                self.target,
                self.settings.page_size,
                token.as_deref(),
                self.settings.mode == Mode::CleanManagedFields,
            )
        })
        .await
    }

    /// Runs `request` until it succeeds, fails for good, or the retry policy is used up.
    async fn with_retries<T, F, Fut>(&self, request: F) -> Result<T, Answer>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Answer>>,
    {
        request
            .retry(self.settings.retry.backoff())
            .sleep(tokio::time::sleep)
            .when(|answer| matches!(classify(answer), Verdict::Retry))
            .adjust(retry_after)
            .notify(|answer, wait| {
                warn!(crd = %self.target.crd, "{}; retrying in {wait:?}", describe(answer));
            })
            .await
    }

    /// Rewrites the object's stale managedFields entries with a guarded JSON Patch (the
    /// resourceVersion it was read at is tested); an object changed since is read again (a
    /// failed `test` answers 422, as apiserver-samples/03). `Ok(false)`: nothing to rewrite.
    async fn clean_managed_fields(&self, key: &ObjectKey) -> Result<bool, Answer> {
        let cleanup = &self.settings.managed_fields;
        let storage = self.target.storage_version.as_str();
        let translate = |path: &[String], from: &str| match &self.converter {
            Some(converter) => converter.translate_path(path, from, storage),
            None => Some(path.to_vec()),
        };
        let (mut resource_version, mut entries) = (key.resource_version.clone(), key.managed_fields.clone());
        for _ in 0..3 {
            let stale: std::collections::BTreeSet<String> = match &cleanup.versions {
                Some(versions) => versions.iter().cloned().collect(),
                None => managed_fields::named_versions(&entries, &self.target.group)
                    .into_iter()
                    .filter(|v| !self.target.versions.contains(v))
                    .collect(),
            };
            let rewrite = managed_fields::Rewrite {
                group: &self.target.group,
                stale: &stale,
                into: storage,
                translate: &translate,
            };
            let Some(rewritten) = rewrite.apply(&entries) else {
                return Ok(false);
            };
            if cleanup.dry_run {
                return Ok(true);
            }
            match self
                .requester
                .replace_managed_fields(self.target, key, &resource_version, &rewritten)
                .await
            {
                Answer::Ok => return Ok(true),
                Answer::Status { code: 422, .. } => {
                    (resource_version, entries) = self.requester.managed_fields(self.target, key).await?;
                }
                other => return Err(other),
            }
        }
        Err(Answer::Transport(format!(
            "{key} kept changing while its managedFields were being rewritten"
        )))
    }

    async fn process_object(&self, page: usize, key: ObjectKey) -> (usize, Processed, ObjectKey) {
        let processed = self.process(&key).await;
        (page, processed, key)
    }

    fn list_error(&self, message: String) -> Error {
        Error::List {
            crd: self.target.crd.clone(),
            version: self.target.version.clone(),
            message,
        }
    }

    /// Rewrites (or reads) one object, retrying what may succeed later.
    async fn process(&self, key: &ObjectKey) -> Processed {
        let attempts = AtomicU32::new(0);
        let result = self
            .with_retries(|| async {
                attempts.fetch_add(1, Ordering::Relaxed);
                let answer = match self.settings.mode {
                    Mode::Rewrite => self.requester.rewrite(self.target, key).await,
                    Mode::Preflight => self.requester.read(self.target, key).await,
                    Mode::CleanManagedFields => match self.clean_managed_fields(key).await {
                        Ok(true) => Answer::Ok,
                        Ok(false) => return Ok(Processed::Skipped),
                        Err(answer) => answer,
                    },
                };
                match classify(&answer) {
                    Verdict::Done => Ok(Processed::Done),
                    Verdict::Skipped => Ok(Processed::Skipped),
                    Verdict::Fail | Verdict::Retry => Err(answer),
                }
            })
            .await;
        match result {
            Ok(processed) => processed,
            Err(answer) => match classify(&answer) {
                Verdict::Retry => Processed::Failed(format!(
                    "{} (gave up after {} attempts)",
                    describe(&answer),
                    attempts.load(Ordering::Relaxed)
                )),
                _ => Processed::Failed(describe(&answer)),
            },
        }
    }
}

/// The apiserver's `Retry-After` instead of the backoff, while retries are left.
fn retry_after(answer: &Answer, backoff: Option<Duration>) -> Option<Duration> {
    match (answer, backoff) {
        (
            Answer::Status {
                retry_after: Some(wait),
                ..
            },
            Some(_),
        ) => Some(*wait),
        _ => backoff,
    }
}
/// What to do after an answer.
enum Verdict {
    Done,
    Skipped,
    Fail,
    /// Retry (after the apiserver's `Retry-After` if it gave one).
    Retry,
}

fn classify(answer: &Answer) -> Verdict {
    match answer {
        Answer::Ok => Verdict::Done,
        // Written since it was listed, so already stored in the storage version (12).
        Answer::Status { code: 409, .. } => Verdict::Skipped,
        // Deleted since it was listed (13) — but a plain-text 404 means the version is not
        // served (15), which must not pass for "deleted".
        Answer::Status {
            code: 404,
            is_status_object: true,
            ..
        } => Verdict::Skipped,
        Answer::Status { code: 429, .. } => Verdict::Retry,
        // 5xx may be transient, or a conversion webhook failing for good (20, 21): retried
        // a bounded number of times, then recorded.
        Answer::Status { code, .. } if *code >= 500 => Verdict::Retry,
        Answer::Status { .. } => Verdict::Fail,
        // No answer, a reset, or a timeout.
        Answer::Transport(_) => Verdict::Retry,
    }
}

fn describe(answer: &Answer) -> String {
    match answer {
        Answer::Ok => "ok".to_owned(),
        Answer::Status {
            code,
            reason,
            message,
            ..
        } => format!("{code} {reason}: {message}"),
        Answer::Transport(message) => message.clone(),
    }
}

enum TrimResult {
    Trimmed(Vec<String>),
    NotTrimmed(String),
    StorageChanged(String),
}

/// Sets `status.storedVersions` to the storage version alone, only if the CRD still has
/// the generation and storage version the run started with, with a resourceVersion
/// precondition (the apiserver itself accepts any trim, apiserver-samples/14).
async fn trim(requester: &Requester<'_>, target: &Target, settings: &Settings) -> Result<TrimResult, Error> {
    let client = requester.client;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut confirmed = false;
    for _ in 0..5 {
        let crd = read_crd(client, &target.crd, settings).await?;
        let now = Target::from_crd(&crd).map_err(|reason| Error::Unmigratable {
            crd: target.crd.clone(),
            reason,
        })?;
        if now.storage_version != target.storage_version {
            return Ok(TrimResult::StorageChanged(now.storage_version));
        }
        if now.generation != target.generation {
            return Ok(TrimResult::NotTrimmed(format!(
                "the CRD's generation changed from {} to {} during the run; run the migration again",
                target.generation.unwrap_or_default(),
                now.generation.unwrap_or_default()
            )));
        }
        if now.stored_versions == [target.storage_version.clone()] {
            return Ok(TrimResult::Trimmed(Vec::new()));
        }
        // Trim only while the apiserver still stores in the version every object was
        // rewritten into.
        if !confirmed {
            discovery::wait(requester, target, Expect::Storage, &settings.settle).await?;
            confirmed = true;
        }
        let patch = json!({
            "metadata": {"resourceVersion": crd.metadata.resource_version},
            "status": {"storedVersions": [target.storage_version]},
        });
        // Retried after a timeout too: the resourceVersion precondition makes a repeat of
        // a trim that did land answer 409, and the re-read then finds it done.
        let params = PatchParams::default();
        let patch = Patch::Merge(&patch);
        let trimmed = kube_request(settings, "trimming status.storedVersions", || {
            crds.patch_status(&target.crd, &params, &patch)
        })
        .await;
        match trimmed {
            Ok(_) => return Ok(TrimResult::Trimmed(now.stored_versions)),
            Err(Error::Kube(kube::Error::Api(status))) if status.code == 409 => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(TrimResult::NotTrimmed(
        "the CRD kept changing while status.storedVersions was being trimmed".to_owned(),
    ))
}
