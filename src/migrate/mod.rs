//! The storage-version migrator: rewrites every object of a CRD through the apiserver (and
//! so through its conversion webhook) into the storage version, then trims the CRD's
//! `status.storedVersions` to that version.
//!
//! Memory is bounded by the page size and the concurrency, whatever the number of objects:
//! objects are listed metadata-only, a page at a time, and processed by a bounded pool of
//! requests while the next page is fetched. Progress is checkpointed per page (the continue
//! token after the last page whose objects are all done), so a run can resume.

pub mod command;
mod progress;

mod requests;
mod target;

use crate::sync::lock;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::collections::VecDeque;

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

pub use progress::{Checkpoint, Counts, ObjectResult, Observer, PageTracker, Quiet};
pub use requests::{Answer, ObjectKey};
pub use target::Target;

/// What to do with each object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Rewrite it into the storage version, then trim `status.storedVersions`.
    Rewrite,
    /// Only read it through the storage version (conversion preflight); write nothing.
    Preflight,
}

/// How requests that may succeed later are retried.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts per object, the first included.
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

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Objects per list request.
    pub page_size: u32,
    /// Requests per second (lists included); 0 for no limit.
    pub qps: u32,
    pub mode: Mode,
    pub retry: RetryPolicy,
    /// Resume a run: the continue token of its last checkpoint and its counts so far.
    pub resume: Option<(String, Counts)>,
    /// How many failures the report lists.
    pub max_reported_failures: usize,
    /// How often the whole run may start over because the storage version changed.
    pub max_restarts: usize,
    /// With `Mode::Preflight`: read through this version instead of the storage version
    /// (the version a `store` is about to switch to).
    pub through_version: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            concurrency: 16,
            page_size: 500,
            qps: 0,
            mode: Mode::Rewrite,
            retry: RetryPolicy::default(),
            resume: None,
            max_reported_failures: 20,
            max_restarts: 3,
            through_version: None,
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
    /// Listing passes that started over (expired continue token, changed storage version).
    pub restarts: usize,
    pub elapsed: Duration,
}

impl Report {
    /// Whether the run did all it was asked to.
    pub fn succeeded(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::Trimmed { .. } | Outcome::AlreadyMigrated | Outcome::PreflightPassed
        )
    }

    /// One line for logs, events and status.
    pub fn summary(&self) -> String {
        let c = &self.counts;
        let counts = format!(
            "{} listed, {} {}, {} skipped, {} failed in {:.1}s",
            c.listed,
            c.rewritten,
            if matches!(self.outcome, Outcome::PreflightPassed) {
                "converted"
            } else {
                "rewritten"
            },
            c.skipped,
            c.failed,
            self.elapsed.as_secs_f64()
        );
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
            Outcome::Failed => {
                let first: Vec<String> = self.failures.iter().take(3).map(ToString::to_string).collect();
                let what = match self.mode {
                    Mode::Rewrite => format!("migration of {} to {}", target.crd, target.version),
                    Mode::Preflight => format!("preflight of {} through {}", target.crd, target.version),
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
    #[error("apiserver request failed: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    /// Short stable label, for metrics and event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Error::CrdNotFound(_) => "crd_not_found",
            Error::Unmigratable { .. } => "unmigratable",
            Error::List { .. } => "list",
            Error::TooManyRestarts { .. } => "too_many_restarts",
            Error::Kube(_) => "kube",
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

    let mut restarts = 0;
    let mut resume = settings.resume.clone();
    loop {
        let through = settings
            .through_version
            .as_deref()
            .filter(|_| settings.mode == Mode::Preflight);
        let target = read_target(client, crd_name, through).await?;
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
                elapsed: started.elapsed(),
            });
        }
        info!(crd = crd_name, storage = %target.storage_version, mode = ?settings.mode, "migration started");
        let run = Run {
            client,
            target: &target,
            settings,
            observer,
            limiter: limiter.as_ref(),
            failures: Mutex::new(Vec::new()),
        };
        let (counts, pass_restarts) = run.all_objects(resume.take()).await?;
        restarts += pass_restarts;
        let failures = run.failures.into_inner().unwrap_or_else(|p| p.into_inner());
        let report = |outcome| Report {
            target: target.clone(),
            mode: settings.mode,
            outcome,
            counts,
            failures: failures.clone(),
            restarts,
            elapsed: started.elapsed(),
        };
        if counts.failed > 0 {
            return Ok(report(Outcome::Failed));
        }
        if settings.mode == Mode::Preflight {
            return Ok(report(Outcome::PreflightPassed));
        }
        match trim(client, &target).await? {
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

async fn read_target(client: &Client, crd_name: &str, through: Option<&str>) -> Result<Target, Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .get_opt(crd_name)
        .await?
        .ok_or_else(|| Error::CrdNotFound(crd_name.to_owned()))?;
    let unmigratable = |reason| Error::Unmigratable {
        crd: crd_name.to_owned(),
        reason,
    };
    let target = Target::from_crd(&crd).map_err(unmigratable)?;
    match through {
        Some(version) => target.through(&crd, version).map_err(unmigratable),
        None => Ok(target),
    }
}

/// One run over the objects of one target.
struct Run<'a> {
    client: &'a Client,
    target: &'a Target,
    settings: &'a Settings,
    observer: &'a dyn Observer,
    limiter: Option<&'a DefaultDirectRateLimiter>,
    failures: Mutex<Vec<Failure>>,
}

/// What became of one object.
enum Processed {
    Done,
    Skipped,
    Failed(String),
}

enum PassEnd {
    Finished,
    /// The continue token expired (410): list again from the start.
    Expired,
}

impl Run<'_> {
    /// Every listing pass until one completes; returns the counts and how many passes
    /// started over.
    async fn all_objects(&self, resume: Option<(String, Counts)>) -> Result<(Counts, usize), Error> {
        let mut restarts = 0;
        let (mut token, mut counts) = match resume {
            Some((token, counts)) => (Some(token), counts),
            None => (None, Counts::default()),
        };
        loop {
            match self.pass(token.take(), &mut counts).await? {
                PassEnd::Finished => return Ok((counts, restarts)),
                PassEnd::Expired => {
                    // Rewrites are idempotent: start the listing over (apiserver-samples/16).
                    restarts += 1;
                    if restarts > self.settings.max_restarts.max(1) * 4 {
                        return Err(self.list_error("the continue token kept expiring".to_owned()));
                    }
                    counts = Counts::default();
                    lock(&self.failures).clear();
                    self.observer
                        .restarted("the list continue token expired; listing again from the start");
                }
            }
        }
    }

    /// One listing pass, from `start` (a continue token) to the last page. Objects are
    /// processed by at most `concurrency` requests at once; the next page is fetched while
    /// the current one's last objects are still in flight, so memory holds about one page.
    async fn pass(&self, start: Option<String>, counts: &mut Counts) -> Result<PassEnd, Error> {
        let concurrency = self.settings.concurrency.max(1);
        let mut tracker = PageTracker::new(*counts);
        let mut queue: VecDeque<(usize, ObjectKey)> = VecDeque::new();
        let mut in_flight = FuturesUnordered::new();
        let mut total: Option<u64> = None;
        // The page being fetched, the index of the next page, and its token once known
        // (`None` after the last page).
        let mut fetching: Option<BoxFuture<'_, Result<requests::Page, Answer>>> =
            Some(self.fetch(start).boxed());
        let mut next_index = 0usize;
        let mut next_token: Option<String> = None;
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
                        // The continue token is older than the etcd compaction (sample 16).
                        Err(Answer::Status { code: 410, .. }) => return Ok(PassEnd::Expired),
                        Err(answer) => return Err(self.list_error(describe(&answer))),
                    };
                    let index = next_index;
                    next_index += 1;
                    counts.listed += page.objects.len() as u64;
                    if let Some(remaining) = page.remaining {
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

    async fn fetch(&self, token: Option<String>) -> Result<requests::Page, Answer> {
        self.throttle().await;
        requests::list_page(
            self.client,
            self.target,
            self.settings.page_size,
            token.as_deref(),
        )
        .await
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

    async fn throttle(&self) {
        if let Some(limiter) = self.limiter {
            limiter.until_ready().await;
        }
    }

    /// Rewrites (or reads) one object, retrying what may succeed later.
    async fn process(&self, key: &ObjectKey) -> Processed {
        let retry = &self.settings.retry;
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.throttle().await;
            let answer = match self.settings.mode {
                Mode::Rewrite => requests::rewrite(self.client, self.target, key).await,
                Mode::Preflight => requests::read(self.client, self.target, key).await,
            };
            let wait = match classify(&answer) {
                Verdict::Done => return Processed::Done,
                Verdict::Skipped => return Processed::Skipped,
                Verdict::Fail => return Processed::Failed(describe(&answer)),
                Verdict::Retry(hint) => hint,
            };
            if attempt >= retry.attempts {
                return Processed::Failed(format!(
                    "{} (gave up after {attempt} attempts)",
                    describe(&answer)
                ));
            }
            let backoff = retry
                .base_delay
                .saturating_mul(1 << (attempt - 1).min(16))
                .min(retry.max_delay);
            tokio::time::sleep(wait.unwrap_or(backoff).max(jitter(backoff))).await;
        }
    }
}

/// What to do after an answer.
enum Verdict {
    Done,
    Skipped,
    Fail,
    /// Retry, after the apiserver's `Retry-After` if it gave one.
    Retry(Option<Duration>),
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
        Answer::Status {
            code: 429,
            retry_after,
            ..
        } => Verdict::Retry(*retry_after),
        // 5xx may be transient, or a conversion webhook failing for good (20, 21): retried
        // a bounded number of times, then recorded.
        Answer::Status {
            code, retry_after, ..
        } if *code >= 500 => Verdict::Retry(*retry_after),
        Answer::Status { .. } => Verdict::Fail,
        Answer::Transport(_) => Verdict::Retry(None),
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

/// Up to a quarter of `delay` more, so that retries of many objects spread out.
fn jitter(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());

    delay + delay.mul_f64(f64::from(nanos % 1000) / 4000.0)
}

enum TrimResult {
    Trimmed(Vec<String>),
    NotTrimmed(String),
    StorageChanged(String),
}

/// Sets `status.storedVersions` to the storage version alone, only if the CRD still has
/// the generation and storage version the run started with, with a resourceVersion
/// precondition (the apiserver itself accepts any trim, apiserver-samples/14).
async fn trim(client: &Client, target: &Target) -> Result<TrimResult, Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for _ in 0..5 {
        let crd = crds
            .get_opt(&target.crd)
            .await?
            .ok_or_else(|| Error::CrdNotFound(target.crd.clone()))?;
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
        let patch = json!({
            "metadata": {"resourceVersion": crd.metadata.resource_version},
            "status": {"storedVersions": [target.storage_version]},
        });
        match crds
            .patch_status(&target.crd, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(TrimResult::Trimmed(now.stored_versions)),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Ok(TrimResult::NotTrimmed(
        "the CRD kept changing while status.storedVersions was being trimmed".to_owned(),
    ))
}
