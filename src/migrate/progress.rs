//! Counting, checkpoints and observers of a migration run.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

use serde::{Deserialize, Serialize};

use super::target::Target;

/// Objects seen so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Listed (each listing pass counts anew).
    pub listed: u64,
    /// Rewritten (or, in a preflight, read through the storage version).
    pub rewritten: u64,
    /// Needing no rewrite: written or deleted since they were listed (409, 404).
    pub skipped: u64,
    /// Could not be rewritten.
    pub failed: u64,
}

impl Counts {
    /// Objects finished, one way or another.
    pub fn done(&self) -> u64 {
        self.rewritten + self.skipped + self.failed
    }
}

/// Where a listing can resume: after the last page whose objects are all done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checkpoint {
    /// Resume the listing with this continue token.
    Continue(String),
    /// Every page was listed and processed.
    Finished,
}

/// Where an interrupted run resumes, and what it belongs to: a resume is exact only while
/// the CRD has the storage version and conversion the checkpoint was taken with, and had
/// that storage version all along since the checkpointed run started (other CRD changes, a
/// deprecation or a served flag, do not touch what was rewritten).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resume {
    /// The continue token after the last page whose objects are all done.
    pub continue_token: String,
    /// The counts of exactly the objects before the token (never any failure: a page with
    /// a failed object holds the checkpoint, so a resume processes it again).
    pub counts: Counts,
    /// The CRD's generation when the checkpointed run started (`Target::watched_from`).
    pub crd_generation: Option<i64>,
    /// The CRD's resourceVersion when the checkpointed run started: a resumed run watches
    /// the CRD's history from it, so that a storage change during the failover is seen.
    /// `None` in checkpoints from before it was recorded (then only the generation tells).
    pub crd_resource_version: Option<String>,
    /// The storage version objects were rewritten into.
    pub storage_version: String,
    /// The conversion fingerprint (`Target::conversion`) when the checkpoint was taken;
    /// empty when unknown (a checkpoint written before it was recorded).
    pub conversion: String,
}

/// Told about the run as it goes; implementations must be cheap (called once per object).
pub trait Observer: Send + Sync {
    /// A listing pass over `target` starts, from `counts` (non-zero when resumed).
    fn started(&self, _target: &Target, _counts: &Counts) {}
    /// Counts changed; `total` is the apiserver's estimate of the objects in this pass
    /// (listed plus `remainingItemCount`), when it gives one.
    fn progress(&self, _counts: &Counts, _total: Option<u64>) {}
    /// Every object of the pages before `checkpoint` is done; `committed` counts exactly
    /// those objects (what a run resumed from this checkpoint starts from).
    fn checkpoint(&self, _checkpoint: &Checkpoint, _committed: &Counts) {}
    /// A listing pass restarts from the beginning (the CRD changed, or an expired continue
    /// token came without a fresh one).
    fn restarted(&self, _reason: &str) {}
    /// The continue token expired (etcd compaction) and the listing goes on with the fresh
    /// token the apiserver gave (samples 27, 28).
    fn continued(&self, _reason: &str) {}
}

/// An observer that ignores everything.
pub struct Quiet;

impl Observer for Quiet {}

/// What became of one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectResult {
    Rewritten,
    Skipped,
    Failed,
}

impl Counts {
    /// Counts one finished object.
    pub fn record(&mut self, result: ObjectResult) {
        match result {
            ObjectResult::Rewritten => self.rewritten += 1,
            ObjectResult::Skipped => self.skipped += 1,
            ObjectResult::Failed => self.failed += 1,
        }
    }

    fn add(&mut self, other: &Counts) {
        self.listed += other.listed;
        self.rewritten += other.rewritten;
        self.skipped += other.skipped;
        self.failed += other.failed;
    }
}

struct PageProgress {
    remaining: usize,
    next: Option<String>,
    counts: Counts,
}

/// Tracks which listed pages are completely processed, to turn completions (in any order)
/// into checkpoints (in page order). The counts reported with a checkpoint are those of
/// the pages before it only, so that a run resumed from it counts every object once. A page
/// with a failed object holds the checkpoint: a resumed run must process that object again,
/// never skip it.
pub struct PageTracker {
    pages: BTreeMap<usize, PageProgress>,
    committed: Counts,
}

impl PageTracker {
    /// `committed`: the counts of a resumed run at its checkpoint.
    pub fn new(committed: Counts) -> Self {
        Self {
            pages: BTreeMap::new(),
            committed,
        }
    }

    /// A page was listed; returns a checkpoint when this completes a prefix of pages.
    pub fn add(
        &mut self,
        index: usize,
        objects: usize,
        next: Option<String>,
    ) -> Option<(Checkpoint, Counts)> {
        let counts = Counts {
            listed: objects as u64,
            ..Counts::default()
        };
        self.pages.insert(
            index,
            PageProgress {
                remaining: objects,
                next,
                counts,
            },
        );
        self.advance()
    }

    /// One object of page `index` is done.
    pub fn done(&mut self, index: usize, result: ObjectResult) -> Option<(Checkpoint, Counts)> {
        if let Some(page) = self.pages.get_mut(&index) {
            page.remaining = page.remaining.saturating_sub(1);
            page.counts.record(result);
        }
        self.advance()
    }

    /// The continue token of the last listed page expired and the apiserver gave `token` in
    /// its place: the checkpoint after that page is `token` from now on.
    pub fn replace_token(&mut self, token: String) -> Option<(Checkpoint, Counts)> {
        match self.pages.last_entry() {
            Some(mut page) => {
                page.get_mut().next = Some(token);
                None
            }
            // Every listed page is committed: the checkpoint itself moves to the new token.
            None => Some((Checkpoint::Continue(token), self.committed)),
        }
    }

    fn advance(&mut self) -> Option<(Checkpoint, Counts)> {
        let mut latest = None;
        while let Some(entry) = self.pages.first_entry() {
            if entry.get().remaining > 0 || entry.get().counts.failed > 0 {
                break;
            }
            let page = entry.remove();
            self.committed.add(&page.counts);
            latest = Some(page.next.map_or(Checkpoint::Finished, Checkpoint::Continue));
        }
        latest.map(|checkpoint| (checkpoint, self.committed))
    }
}

/// Objects per second over a sliding window, from the objects finished in this process:
/// resumed counts, pauses (`Retry-After`, a settling switch) and restarts do not inflate it.
pub struct Rate {
    window: Duration,
    samples: VecDeque<(Instant, u64)>,
}

impl Rate {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: VecDeque::new(),
        }
    }

    /// Starts measuring anew from `done` objects (a run starts, resumes or restarts).
    pub fn reset(&mut self, at: Instant, done: u64) {
        self.samples.clear();
        self.samples.push_back((at, done));
    }

    /// `done` objects are finished at `at`.
    pub fn record(&mut self, at: Instant, done: u64) {
        if self.samples.back().is_some_and(|(_, last)| done < *last) {
            self.reset(at, done);
            return;
        }
        self.samples.push_back((at, done));
        // Keep one sample older than the window as the baseline.
        while self.samples.len() > 2 && self.samples[1].0 + self.window <= at {
            self.samples.pop_front();
        }
    }

    /// Objects per second over the window ending `now`.
    pub fn per_second(&self, now: Instant) -> f64 {
        let (Some((_, newest)), Some(_)) = (self.samples.back(), self.samples.front()) else {
            return 0.0;
        };
        // The baseline: the last sample at or before the start of the window.
        let start = now.checked_sub(self.window).unwrap_or(now);
        let (since, from) = self
            .samples
            .iter()
            .rev()
            .find(|(at, _)| *at <= start)
            .or(self.samples.front())
            .copied()
            .unwrap_or((now, *newest));
        let seconds = now.saturating_duration_since(since).as_secs_f64();
        if seconds <= 0.0 {
            return 0.0;
        }
        (newest - from) as f64 / seconds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_with_a_failure_holds_the_checkpoint() {
        let mut tracker = PageTracker::new(Counts::default());
        tracker.add(0, 1, Some("after-0".into()));
        tracker.add(1, 1, Some("after-1".into()));
        assert_eq!(tracker.done(1, ObjectResult::Rewritten), None);
        // Page 0's object failed: no checkpoint may pass it, whatever completes after.
        assert_eq!(tracker.done(0, ObjectResult::Failed), None);
        assert_eq!(tracker.add(2, 0, None), None);
    }

    #[test]
    fn a_replaced_token_becomes_the_checkpoint() {
        let mut tracker = PageTracker::new(Counts::default());
        tracker.add(0, 1, Some("expired".into()));
        // The token after page 0 expired while page 0 was still being processed.
        assert_eq!(tracker.replace_token("fresh".into()), None);
        let (checkpoint, _) = tracker.done(0, ObjectResult::Rewritten).expect("checkpoint");
        assert_eq!(checkpoint, Checkpoint::Continue("fresh".into()));
        // Every page committed, then the token expires: the checkpoint moves at once.
        let (checkpoint, committed) = tracker.replace_token("fresher".into()).expect("checkpoint");
        assert_eq!(checkpoint, Checkpoint::Continue("fresher".into()));
        assert_eq!(committed.rewritten, 1);
    }

    #[test]
    fn the_rate_is_that_of_this_process_over_the_window() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut rate = Rate::new(Duration::from_secs(10));
        // Resumed at 10 000 objects: they are not this process' work.
        rate.reset(at(0), 10_000);
        for s in 1..=20 {
            rate.record(at(s), 10_000 + 40 * s);
        }
        assert!(
            (rate.per_second(at(20)) - 40.0).abs() < 0.01,
            "{}",
            rate.per_second(at(20))
        );
        // A pause (Retry-After, a settling switch): the rate falls to what is really done.
        assert!(
            (rate.per_second(at(25)) - 20.0).abs() < 0.01,
            "{}",
            rate.per_second(at(25))
        );
        assert_eq!(rate.per_second(at(31)), 0.0);
        // A restart counts from zero again: no negative or inflated rate.
        rate.record(at(32), 0);
        rate.record(at(33), 50);
        assert!((rate.per_second(at(33)) - 50.0).abs() < 0.01);
    }

    #[test]
    fn checkpoints_follow_page_order_whatever_the_completion_order() {
        let mut tracker = PageTracker::new(Counts::default());
        assert_eq!(tracker.add(0, 2, Some("after-0".into())), None);
        assert_eq!(tracker.add(1, 1, Some("after-1".into())), None);
        // Page 1 completes first: no checkpoint until page 0 is done too.
        assert_eq!(tracker.done(1, ObjectResult::Rewritten), None);
        assert_eq!(tracker.done(0, ObjectResult::Skipped), None);
        let (checkpoint, committed) = tracker.done(0, ObjectResult::Rewritten).expect("checkpoint");
        assert_eq!(checkpoint, Checkpoint::Continue("after-1".into()));
        assert_eq!(
            committed,
            Counts {
                listed: 3,
                rewritten: 2,
                skipped: 1,
                failed: 0
            }
        );
        // An empty last page completes at once.
        assert_eq!(tracker.add(2, 0, None).map(|c| c.0), Some(Checkpoint::Finished));
    }

    #[test]
    fn committed_counts_exclude_pages_after_the_checkpoint() {
        let resumed = Counts {
            listed: 10,
            rewritten: 10,
            skipped: 0,
            failed: 0,
        };
        let mut tracker = PageTracker::new(resumed);
        tracker.add(0, 1, Some("a".into()));
        tracker.add(1, 1, Some("b".into()));
        // Page 1's object is done, page 0's is not: nothing is committed yet.
        assert_eq!(tracker.done(1, ObjectResult::Rewritten), None);
        let (_, committed) = tracker.done(0, ObjectResult::Rewritten).expect("checkpoint");
        assert_eq!(
            committed,
            Counts {
                listed: 12,
                rewritten: 12,
                skipped: 0,
                failed: 0
            }
        );
    }
}
