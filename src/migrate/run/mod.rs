//! One run: listing passes, a bounded pool of rewrites, and per-answer decisions.
//!
//! - here: the listing passes (pages fetched while the last ones' objects are processed,
//!   checkpoints, expired continue tokens) and the retries of every request;
//! - `objects`: one object processed (rewritten, read and checked, or its managedFields
//!   cleaned), and what each answer means.

mod objects;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Mutex;

use backon::Retryable;
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use tracing::warn;

use super::checked::CheckedObjects;
use super::digest::ObjectsDigest;
use super::requests::{self, Requester};
use super::{
    Answer, Counts, Error, Failure, Mode, ObjectKey, ObjectResult, Observer, PageTracker, Resume, Settings,
    Target,
};
use crate::sync::lock;

use objects::{Processed, Verdict, classify, retry_after};

/// One run over the objects of one target.
pub(super) struct Run<'a> {
    pub(super) requester: &'a Requester<'a>,
    pub(super) target: &'a Target,
    pub(super) settings: &'a Settings,
    pub(super) observer: &'a dyn Observer,
    pub(super) failures: Mutex<Vec<Failure>>,
    /// With `Mode::CleanManagedFields`: the policy's conversion, to translate field paths;
    /// with `Mode::Preflight`: the conversion the webhook serves (built once per run, not
    /// per object).
    pub(super) converter: Option<crate::conversion::Converter>,
    /// With `Mode::Preflight` and a conversion: the schema of the version read through.
    pub(super) preflight_schema: Option<crate::schema::Schema>,
}

enum PassEnd {
    Finished,
    /// The continue token expired (410) and the apiserver gave no fresh one: list again
    /// from the start.
    Expired,
}

/// What the passes of one run did.
pub(super) struct Passes {
    pub(super) counts: Counts,
    pub(super) restarts: usize,
    pub(super) expired_tokens: usize,
    /// The objects listed, when this run listed them all (`None` after a resume).
    pub(super) digest: Option<ObjectsDigest>,
    /// In a preflight, the objects listed, when this run listed them all.
    pub(super) checked: Option<CheckedObjects>,
}

impl Run<'_> {
    /// Every listing pass until one completes. The caller runs the settle check first, and
    /// nothing is listed before it passed: what a page says of an object (its
    /// resourceVersion, its managedFields) must be no older than the check, or a write that
    /// an apiserver not yet acting on the change made meanwhile (stored in the old version,
    /// or naming a version being cleaned) would pass for one made after it: a rewrite
    /// answered 409 is skipped as "written since, so stored in the storage version", and a
    /// cleanup decides on the entries it listed.
    pub(super) async fn all_objects(&self, resume: Option<Resume>) -> Result<Passes, Error> {
        let mut passes = Passes {
            counts: Counts::default(),
            restarts: 0,
            expired_tokens: 0,
            digest: Some(ObjectsDigest::default()),
            checked: self.fresh_checked(),
        };
        let mut token = None;
        if let Some(resume) = resume {
            passes.counts = resume.counts;
            passes.digest = None;
            passes.checked = None;
            token = Some(resume.continue_token);
        }
        loop {
            // The total for progress: metadata-only lists carry no remainingItemCount.
            let total = match self.with_retries(|| self.requester.count(self.target)).await {
                Ok(total) => total,
                Err(answer) => {
                    warn!(crd = %self.target.crd, "cannot count the objects: {answer}");
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
                    passes.digest = Some(ObjectsDigest::default());
                    passes.checked = self.fresh_checked();
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
        let digest = &mut passes.digest;
        let checked = &mut passes.checked;
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
            // Done once every object is processed (the settle check succeeded before the
            // pass: a run with no object still trims after it).
            if in_flight.is_empty() && fetching.is_none() && queue.is_empty() {
                return Ok(PassEnd::Finished);
            }
            // `biased`: objects done before the next page (the queue bounds both), in a
            // fixed order that a run on tokio's paused clock replays exactly.
            tokio::select! {
                biased;
                Some((page, processed, key)) = in_flight.next(), if !in_flight.is_empty() => {
                    self.object_done(page, processed, &key, counts, total, &mut tracker);
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
                            self.go_on_with_a_fresh_token(
                                &fresh,
                                &mut expired_in_a_row,
                                &mut passes.expired_tokens,
                                &mut tracker,
                            )?;
                            fetching = Some(self.fetch(Some(fresh)).boxed());
                            continue;
                        }
                        // Expired without a fresh token (sample 16 has one; an older
                        // apiserver may not): only a new list is left.
                        Err(Answer::Status { code: 410, .. }) => return Ok(PassEnd::Expired),
                        Err(answer) => return Err(self.list_error(answer.to_string())),
                    };
                    expired_in_a_row = 0;
                    let index = next_index;
                    next_index += 1;
                    count_listed_page(&page, counts, digest, checked, &mut total);
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

    /// Records what became of one object (a failure's message, up to the reported
    /// number), its progress, and the checkpoint it completes, if any.
    fn object_done(
        &self,
        page: usize,
        processed: Processed,
        key: &ObjectKey,
        counts: &mut Counts,
        total: Option<u64>,
        tracker: &mut PageTracker,
    ) {
        let result = match processed {
            Processed::Done => ObjectResult::Rewritten,
            Processed::Skipped => ObjectResult::Skipped,
            Processed::Failed(message) => {
                let mut failures = lock(&self.failures);
                if failures.len() < self.settings.max_reported_failures {
                    failures.push(Failure {
                        object: key.to_string(),
                        message,
                    });
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

    /// The continue token expired and the apiserver gave a `fresh` one: counted, bounded
    /// (`max_expired_in_a_row`), and checkpointed; the caller lists on with it.
    fn go_on_with_a_fresh_token(
        &self,
        fresh: &str,
        expired_in_a_row: &mut usize,
        expired_tokens: &mut usize,
        tracker: &mut PageTracker,
    ) -> Result<(), Error> {
        *expired_in_a_row += 1;
        *expired_tokens += 1;
        if *expired_in_a_row > self.settings.max_expired_in_a_row {
            return Err(self.list_error(format!(
                "the continue token expired {expired_in_a_row} times in a row"
            )));
        }
        self.observer.continued(
            "the list continue token expired (etcd compaction); going on with the fresh token the apiserver gave",
        );
        if let Some((checkpoint, committed)) = tracker.replace_token(fresh.to_owned()) {
            self.observer.checkpoint(&checkpoint, &committed);
        }
        Ok(())
    }

    /// What a preflight collects of the objects it lists (nothing for other runs).
    fn fresh_checked(&self) -> Option<CheckedObjects> {
        (self.settings.mode == Mode::Preflight).then(CheckedObjects::default)
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
                warn!(crd = %self.target.crd, "{answer}; retrying in {wait:?}");
            })
            .await
    }

    fn list_error(&self, message: String) -> Error {
        Error::List {
            crd: self.target.crd.clone(),
            version: self.target.version.clone(),
            message,
        }
    }
}

/// Counts a listed page's objects, adds them to the digest of the objects and to what a
/// preflight collects (where the pass keeps them), and learns the total from the page
/// while it is not known.
fn count_listed_page(
    page: &requests::Page,
    counts: &mut Counts,
    digest: &mut Option<ObjectsDigest>,
    checked: &mut Option<CheckedObjects>,
    total: &mut Option<u64>,
) {
    counts.listed += page.objects.len() as u64;
    if let Some(digest) = digest.as_mut() {
        page.objects.iter().for_each(|key| digest.add(key));
    }
    if let Some(checked) = checked.as_mut() {
        page.objects.iter().for_each(|key| checked.add(key));
    }
    if total.is_none()
        && let Some(remaining) = page.remaining
    {
        *total = Some(counts.listed + remaining);
    }
}
