//! The writers gate's reads of a CRD's objects: one background task per CRD whose writers
//! gate is due folds the objects' managedFields (`audit::read_writes`: paged, metadata
//! only, memory bounded by the page), and reconciles reuse its result while it stands.
//! No reconcile waits for a listing of every object, and the reconciles that the
//! controller's own status writes cause start none.
//!
//! A result stands, for a gated version, until the later of:
//! - its freshness after the read started: 1% of the gate's window, at least a minute and
//!   at most 15 minutes. A write in that span before the read that lifts the gate can be
//!   missed; every read that lifts a gate started at most that long before.
//! - the instant the gate could lift on that result (the last write plus the window):
//!   until then the result holds the gate, and a newer write could only hold it longer.
//!
//! Object writes do not change the CRD, so changes of the CRD (such as the transitions the
//! same reconcile applies) or of the policy start no new read; a CRD deleted and created
//! again (another uid, other objects) does. A read that failed is tried again after a
//! minute. These results are a cache: a restarted or new leader reads again, and a gate
//! whose read has not finished holds.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::audit::Writes;
use crate::lifecycle::WritersRead;
use crate::migrate::{ListSettings, RetryPolicy};
use crate::sync::lock;

/// How often a reconcile looks again while a read is under way (to show its progress and
/// take its result).
const READING_RECHECK: Duration = Duration::from_secs(5);

/// How long after a failed read the next one starts.
const RETRY_FAILED_AFTER: Duration = Duration::from_secs(60);

/// Reads that no reconcile asked for this long are dropped (the gate is no longer due, or
/// the policy is gone).
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The reads of the writers gates, one per CRD.
pub struct WritersGateReads {
    client: Client,
    settings: ListSettings,
    retry_failed_after: Duration,
    reads: Mutex<HashMap<String, Read>>,
}

/// What the writers gates of one policy know now.
#[derive(Debug, Default)]
pub struct WritersReport {
    /// Per gated version.
    pub writers: BTreeMap<String, WritersRead>,
    /// When the reconcile should look again: a read under way, or a failed one to retry.
    pub recheck_at: Option<Timestamp>,
}

/// When a read ended, and with what.
type Ended = (Instant, Result<Writes, String>);

/// One read of a CRD's objects.
struct Read {
    /// The uid of the CRD it reads.
    crd_uid: Option<String>,
    /// When it started, on the controller's clock.
    started_at: Timestamp,
    /// Objects read so far.
    progress: Arc<AtomicU64>,
    /// How it ended, and when (`None` while it runs).
    ended: Arc<Mutex<Option<Ended>>>,
    handle: JoinHandle<()>,
    /// When a reconcile last asked for it.
    asked: Instant,
}

impl Drop for Read {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

impl WritersGateReads {
    pub fn new(client: Client) -> Self {
        WritersGateReads {
            client,
            settings: ListSettings::default(),
            retry_failed_after: RETRY_FAILED_AFTER,
            reads: Mutex::new(HashMap::new()),
        }
    }

    /// How a page that failed transiently is asked for again.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.settings.retry = retry;
        self
    }

    /// What is known of the writes through `gated` (each version with its gate's window) of
    /// `crd` at `now`: a read under way, its result while it stands, or a failure. Starts a
    /// read in the background (`page_size` objects per list page) when none stands; with
    /// nothing gated, drops the CRD's read.
    pub fn writers(
        &self,
        crd: &CustomResourceDefinition,
        gated: &[(String, SignedDuration)],
        page_size: u32,
        now: Timestamp,
    ) -> WritersReport {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut reads = lock(&self.reads);
        reads.retain(|_, read| read.asked.elapsed() < FORGET_AFTER);
        if gated.is_empty() {
            reads.remove(&name);
            return WritersReport::default();
        }
        let stands = reads
            .get(&name)
            .is_some_and(|read| self.stands(read, crd, gated, now));
        if !stands {
            info!(
                crd = name,
                "reading the objects' managedFields for the writers gate"
            );
            reads.insert(name.clone(), self.start(crd, page_size, now));
        }
        let Some(read) = reads.get_mut(&name) else {
            return WritersReport::default();
        };
        read.asked = Instant::now();
        let ended = lock(&read.ended);
        let (read_state, recheck) = match &*ended {
            None => (
                WritersRead::Reading {
                    objects: read.progress.load(Ordering::Relaxed),
                },
                Some(READING_RECHECK),
            ),
            Some((at, Err(error))) => (
                WritersRead::Failed(error.clone()),
                Some(self.retry_failed_after.saturating_sub(at.elapsed())),
            ),
            Some((_, Ok(writes))) => {
                let writers = gated
                    .iter()
                    .map(|(version, _)| (version.clone(), WritersRead::Read(writes.last_writes(version))))
                    .collect();
                return WritersReport {
                    writers,
                    recheck_at: None,
                };
            }
        };
        WritersReport {
            writers: gated
                .iter()
                .map(|(version, _)| (version.clone(), read_state.clone()))
                .collect(),
            recheck_at: recheck.and_then(|wait| now.checked_add(wait).ok()),
        }
    }

    /// Whether `read` still answers for the CRD's gated versions at `now`.
    fn stands(
        &self,
        read: &Read,
        crd: &CustomResourceDefinition,
        gated: &[(String, SignedDuration)],
        now: Timestamp,
    ) -> bool {
        if read.crd_uid != crd.metadata.uid {
            return false;
        }
        match &*lock(&read.ended) {
            None => true,
            Some((at, Err(_))) => at.elapsed() < self.retry_failed_after,
            Some((_, Ok(writes))) => result_stands(writes, read.started_at, gated, now),
        }
    }

    /// Starts reading the CRD's objects in the background.
    fn start(&self, crd: &CustomResourceDefinition, page_size: u32, now: Timestamp) -> Read {
        let progress = Arc::new(AtomicU64::new(0));
        let ended = Arc::new(Mutex::new(None));
        let task = {
            let client = self.client.clone();
            let crd = crd.clone();
            let settings = ListSettings {
                page_size,
                ..self.settings.clone()
            };
            let progress = progress.clone();
            let ended = ended.clone();
            async move {
                let result = crate::audit::read_writes(&client, &crd, &settings, Some(&progress)).await;
                if let Err(error) = &result {
                    warn!(
                        crd = crd.metadata.name.as_deref().unwrap_or_default(),
                        error, "cannot read managedFields for the writers gate"
                    );
                }
                *lock(&ended) = Some((Instant::now(), result));
            }
        };
        Read {
            crd_uid: crd.metadata.uid.clone(),
            started_at: now,
            progress,
            ended,
            handle: tokio::spawn(task),
            asked: Instant::now(),
        }
    }
}

/// Whether the writes a read that started at `started_at` found still answer for every
/// gated version at `now`: while it is fresh, or while it holds the gate (until the last
/// write plus the window).
fn result_stands(
    writes: &Writes,
    started_at: Timestamp,
    gated: &[(String, SignedDuration)],
    now: Timestamp,
) -> bool {
    gated.iter().all(|(version, window)| {
        let fresh_until = started_at + freshness(*window);
        let lifts_at = writes
            .last_writes(version)
            .iter()
            .map(|(_, last)| *last + *window)
            .max();
        now < lifts_at.map_or(fresh_until, |at| at.max(fresh_until))
    })
}

/// How long a read that lets a gate with `window` lift stands: 1% of the window, at least
/// a minute, at most 15 minutes.
fn freshness(window: SignedDuration) -> SignedDuration {
    (window / 100).clamp(SignedDuration::from_secs(60), SignedDuration::from_secs(900))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_is_a_hundredth_of_the_window_within_bounds() {
        let hours = |h: i64| SignedDuration::from_hours(h);
        assert_eq!(freshness(hours(1)), SignedDuration::from_secs(60));
        assert_eq!(freshness(hours(24)), SignedDuration::from_secs(864));
        assert_eq!(freshness(hours(24 * 7)), SignedDuration::from_secs(900));
    }

    #[test]
    fn a_result_stands_while_fresh_or_while_it_holds_the_gate() {
        let at = |t: &str| -> Timestamp { t.parse().expect("instant") };
        let week = SignedDuration::from_hours(24 * 7);
        let gated = [("v1alpha1".to_owned(), week)];
        let started = at("2026-05-31T00:00:00Z");
        // Nobody wrote: it would lift the gate, so it stands only while fresh (15 minutes).
        let none = Writes::default();
        assert!(result_stands(&none, started, &gated, at("2026-05-31T00:14:59Z")));
        assert!(!result_stands(&none, started, &gated, at("2026-05-31T00:15:00Z")));
        // A write on 2026-05-28T12:00: it holds the gate until 2026-06-04T12:00.
        let mut writes = Writes::default();
        writes.add(&[crate::audit::Entry {
            manager: "legacy".into(),
            version: "v1alpha1".into(),
            time: Some(at("2026-05-28T12:00:00Z")),
        }]);
        assert!(result_stands(
            &writes,
            started,
            &gated,
            at("2026-06-04T11:59:59Z")
        ));
        assert!(!result_stands(
            &writes,
            started,
            &gated,
            at("2026-06-04T12:00:00Z")
        ));
        // A write long ago holds nothing: fresh only.
        let mut old = Writes::default();
        old.add(&[crate::audit::Entry {
            manager: "legacy".into(),
            version: "v1alpha1".into(),
            time: Some(at("2026-01-01T00:00:00Z")),
        }]);
        assert!(!result_stands(&old, started, &gated, at("2026-05-31T00:15:00Z")));
    }
}
