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
    /// Every object of the pages before `checkpoint` is done.
    fn checkpoint(&self, _checkpoint: &Checkpoint, _counts: &Counts) {}
    /// A listing pass restarts from the beginning (the continue token expired).
    fn restarted(&self, _reason: &str) {}
}

/// An observer that ignores everything.
pub struct Quiet;

impl Observer for Quiet {}

/// Tracks which listed pages are completely processed, to turn completions (in any order)
/// into checkpoints (in page order).
#[derive(Default)]
pub struct PageTracker {
    /// Page index → (objects not yet done, continue token after the page).
    pages: BTreeMap<usize, (usize, Option<String>)>,
}

impl PageTracker {
    /// A page was listed; returns a checkpoint when this completes a prefix of pages.
    pub fn add(&mut self, index: usize, objects: usize, next: Option<String>) -> Option<Checkpoint> {
        self.pages.insert(index, (objects, next));
        self.advance()
    }

    /// One object of page `index` is done.
    pub fn done(&mut self, index: usize) -> Option<Checkpoint> {
        if let Some((remaining, _)) = self.pages.get_mut(&index) {
            *remaining = remaining.saturating_sub(1);
        }
        self.advance()
    }

    fn advance(&mut self) -> Option<Checkpoint> {
        let mut latest = None;
        while let Some(entry) = self.pages.first_entry() {
            if entry.get().0 > 0 {
                break;
            }
            let (_, next) = entry.remove();
            latest = Some(next.map_or(Checkpoint::Finished, Checkpoint::Continue));
        }
        latest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_follow_page_order_whatever_the_completion_order() {
        let mut tracker = PageTracker::default();
        assert_eq!(tracker.add(0, 2, Some("after-0".into())), None);
        assert_eq!(tracker.add(1, 1, Some("after-1".into())), None);
        // Page 1 completes first: no checkpoint until page 0 is done too.
        assert_eq!(tracker.done(1), None);
        assert_eq!(tracker.done(0), None);
        assert_eq!(tracker.done(0), Some(Checkpoint::Continue("after-1".into())));
        // An empty last page completes at once.
        assert_eq!(tracker.add(2, 0, None), Some(Checkpoint::Finished));
    }
}
