//! Counting, checkpoints and observers of a migration run.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

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

/// Told about the run as it goes; implementations must be cheap (called once per object).
pub trait Observer: Send + Sync {
    /// Counts changed; `total` is the apiserver's estimate of the objects in this pass
    /// (listed plus `remainingItemCount`), when it gives one.
    fn progress(&self, _counts: &Counts, _total: Option<u64>) {}
    /// Every object of the pages before `checkpoint` is done; `committed` counts exactly
    /// those objects (what a run resumed from this checkpoint starts from).
    fn checkpoint(&self, _checkpoint: &Checkpoint, _committed: &Counts) {}
    /// A listing pass restarts from the beginning (the continue token expired).
    fn restarted(&self, _reason: &str) {}
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
/// the pages before it only, so that a run resumed from it counts every object once.
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

    fn advance(&mut self) -> Option<(Checkpoint, Counts)> {
        let mut latest = None;
        while let Some(entry) = self.pages.first_entry() {
            if entry.get().remaining > 0 {
                break;
            }
            let page = entry.remove();
            self.committed.add(&page.counts);
            latest = Some(page.next.map_or(Checkpoint::Finished, Checkpoint::Continue));
        }
        latest.map(|checkpoint| (checkpoint, self.committed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_follow_page_order_whatever_the_completion_order() {
        let mut tracker = PageTracker::new(Counts::default());
        assert_eq!(tracker.add(0, 2, Some("after-0".into())), None);
        assert_eq!(tracker.add(1, 1, Some("after-1".into())), None);
        // Page 1 completes first: no checkpoint until page 0 is done too.
        assert_eq!(tracker.done(1, ObjectResult::Rewritten), None);
        assert_eq!(tracker.done(0, ObjectResult::Skipped), None);
        let (checkpoint, committed) = tracker.done(0, ObjectResult::Failed).expect("checkpoint");
        assert_eq!(checkpoint, Checkpoint::Continue("after-1".into()));
        assert_eq!(
            committed,
            Counts {
                listed: 3,
                rewritten: 1,
                skipped: 1,
                failed: 1
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
