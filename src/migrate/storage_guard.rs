//! The storage guard: watches a CRD for the whole of a migration, so that the trim knows
//! whether every object written during the run is stored in the run's storage version.
//!
//! A run rewrites every object into the storage version it read at its start, and the
//! apiserver stores every object written meanwhile in the storage version of the moment. If
//! that changed and changed back during the run (a GitOps tool re-applies an old CRD, the
//! controller restores the new one), objects written in between are stored in the other
//! version even though `storedVersions` listed it all along, and trimming it would lose them.
//!
//! The guard watches the CRD from the state the run started at (for a resumed run, the state
//! the interrupted run started at, from its checkpoint, so that a change during the failover
//! is replayed), reconnecting from the last resourceVersion it saw. Asked about the state the
//! trim is about to act on, it answers:
//! - `Unchanged`: every state from the start to that one was seen and had the run's storage
//!   version, served. Other changes (a deprecation, a served flag: the controller's own next
//!   transitions) leave every rewritten object where it is.
//! - `Changed`: some state had another storage version (or an unserved one), or the CRD was
//!   deleted; or part of the history could not be watched (410 Expired after an etcd
//!   compaction, an ERROR event, a state not delivered within `wait`) and the CRD's
//!   generation moved across that part. That is Kubernetes' own rule for its built-in
//!   migrator (`finishCRDMigration` trims only if the generation is still the one the
//!   migration started at): every spec change, a storage change included, moves it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::target::Target;
use crate::sync::lock;

/// How long one watch request lasts before the guard reconnects (the apiserver ends it).
const WATCH_SECONDS: u32 = 290;

/// States of the CRD remembered to prove that the watch delivered the one being checked.
const REMEMBERED_STATES: usize = 1024;

/// A state of the CRD known to have had the run's storage version: where the guard starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardStart {
    pub resource_version: String,
    pub generation: Option<i64>,
    pub storage_version: String,
}

impl GuardStart {
    /// The state a target was read at.
    pub fn of(target: &Target) -> GuardStart {
        GuardStart {
            resource_version: target.resource_version.clone().unwrap_or_default(),
            generation: target.generation,
            storage_version: target.storage_version.clone(),
        }
    }
}

/// What the CRD's history since the guard's start says about a trim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every state had the run's storage version (or the generation did not move across a
    /// part that could not be watched).
    Unchanged,
    /// Objects may have been stored in another version since the start (the reason).
    Changed(String),
}

/// Watches one CRD from a start state until dropped.
pub struct StorageGuard {
    start: GuardStart,
    record: Arc<Mutex<Record>>,
    updates: watch::Receiver<u64>,
    wait: Duration,
    task: JoinHandle<()>,
}

impl Drop for StorageGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One state of the CRD the guard saw.
#[derive(Clone, Debug)]
struct Seen {
    resource_version: String,
    generation: Option<i64>,
}

/// What the watch has seen so far.
struct Record {
    crd: String,
    storage_version: String,
    /// The first reason the history forbids the trim.
    changed: Option<String>,
    /// The resourceVersions of the last states seen, the start included.
    recent: VecDeque<String>,
    last: Seen,
}

impl Record {
    fn remember(&mut self, seen: Seen) {
        if self.recent.len() == REMEMBERED_STATES {
            self.recent.pop_front();
        }
        self.recent.push_back(seen.resource_version.clone());
        self.last = seen;
    }

    fn forbid(&mut self, reason: String) {
        if self.changed.is_none() {
            warn!(crd = self.crd, "no trim without a new run: {reason}");
            self.changed = Some(reason);
        }
    }

    /// A state of the CRD the watch delivered (or read after a gap).
    fn observe(&mut self, crd: &CustomResourceDefinition) {
        let resource_version = crd.metadata.resource_version.clone().unwrap_or_default();
        if let Some(problem) = storage_problem(crd, &self.storage_version) {
            self.forbid(format!("{problem} at resourceVersion {resource_version}"));
        }
        self.remember(Seen {
            resource_version,
            generation: crd.metadata.generation,
        });
    }

    /// The watch lost part of the history (`reason`); `now` is the CRD read right after.
    fn gap(&mut self, reason: &str, now: &CustomResourceDefinition) {
        let before = self.last.clone();
        let after = now.metadata.generation;
        if before.generation.is_none() || before.generation != after {
            self.forbid(format!(
                "the CRD's history after resourceVersion {} could not be watched ({reason}) and its generation moved from {} to {} meanwhile",
                before.resource_version,
                describe(before.generation),
                describe(after),
            ));
        }
        self.observe(now);
    }
}

fn describe(generation: Option<i64>) -> String {
    generation.map_or_else(|| "unknown".to_owned(), |g| g.to_string())
}

/// Why objects written while the CRD is in this state may not be stored in `storage`.
fn storage_problem(crd: &CustomResourceDefinition, storage: &str) -> Option<String> {
    let stored: Vec<_> = crd.spec.versions.iter().filter(|v| v.storage).collect();
    match stored.as_slice() {
        [version] if version.name == storage && version.served => None,
        [version] if version.name == storage => Some(format!("the storage version {storage} was not served")),
        [version] => Some(format!(
            "the storage version was {} instead of {storage}",
            version.name
        )),
        _ => Some(format!("the CRD had {} storage versions", stored.len())),
    }
}

impl StorageGuard {
    /// Starts watching the CRD from `start`. `wait`: how long `check` waits for the watch to
    /// deliver the state asked about before the generation rule decides.
    pub fn start(client: &Client, crd: &str, start: GuardStart, wait: Duration) -> StorageGuard {
        let record = Arc::new(Mutex::new(Record {
            crd: crd.to_owned(),
            storage_version: start.storage_version.clone(),
            changed: None,
            recent: VecDeque::from([start.resource_version.clone()]),
            last: Seen {
                resource_version: start.resource_version.clone(),
                generation: start.generation,
            },
        }));
        let (updated, updates) = watch::channel(0);
        let task = tokio::spawn(follow(
            Api::all(client.clone()),
            crd.to_owned(),
            record.clone(),
            updated,
            start.resource_version.clone(),
        ));
        StorageGuard {
            start,
            record,
            updates,
            wait,
            task,
        }
    }

    /// Where the guard started.
    pub fn started_from(&self) -> &GuardStart {
        &self.start
    }

    /// Whether objects may have been stored in a version other than the start's storage
    /// version at any point from the start to `current` (the CRD as just read; a trim
    /// carries its resourceVersion as a precondition). Waits up to `wait` for the watch to
    /// deliver `current`; if it does not, the generation decides as across a gap.
    pub async fn check(&self, current: &Target) -> Verdict {
        let storage = &self.start.storage_version;
        if current.storage_version != *storage {
            return Verdict::Changed(format!(
                "the storage version is {} instead of {storage}",
                current.storage_version
            ));
        }
        let Some(resource_version) = current.resource_version.as_deref() else {
            return Verdict::Changed("the CRD as read has no resourceVersion".to_owned());
        };
        let deadline = tokio::time::Instant::now() + self.wait;
        let mut updates = self.updates.clone();
        loop {
            {
                let record = lock(&self.record);
                if let Some(reason) = &record.changed {
                    return Verdict::Changed(reason.clone());
                }
                if record.recent.iter().any(|rv| rv == resource_version) {
                    return Verdict::Unchanged;
                }
            }
            match tokio::time::timeout_at(deadline, updates.changed()).await {
                Ok(Ok(())) => {}
                // Not delivered in time, or the watch stopped.
                _ => break,
            }
        }
        let record = lock(&self.record);
        if let Some(reason) = &record.changed {
            return Verdict::Changed(reason.clone());
        }
        if record.last.generation.is_some() && record.last.generation == current.generation {
            debug!(crd = %current.crd, resource_version, "not delivered by the watch; the generation did not move");
            return Verdict::Unchanged;
        }
        Verdict::Changed(format!(
            "the watch of the CRD did not deliver resourceVersion {resource_version} within {:?}, and the generation moved from {} (resourceVersion {}) to {}",
            self.wait,
            describe(record.last.generation),
            record.last.resource_version,
            describe(current.generation),
        ))
    }
}

/// Watches the CRD by name from `from`, reconnecting from the last resourceVersion seen,
/// until aborted.
async fn follow(
    api: Api<CustomResourceDefinition>,
    name: String,
    record: Arc<Mutex<Record>>,
    updated: watch::Sender<u64>,
    mut from: String,
) {
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(WATCH_SECONDS);
    let notify = || updated.send_modify(|n| *n = n.wrapping_add(1));
    // Connections in a row that moved nothing on (failed, ended empty, or lost history).
    let mut failures: u32 = 0;
    loop {
        let mut progressed = false;
        let gap = match api.watch(&params, &from).await {
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream);
                let mut gap = None;
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(WatchEvent::Added(crd) | WatchEvent::Modified(crd)) => {
                            from = crd.metadata.resource_version.clone().unwrap_or(from);
                            lock(&record).observe(&crd);
                            notify();
                        }
                        Ok(WatchEvent::Deleted(crd)) => {
                            from = crd.metadata.resource_version.clone().unwrap_or(from);
                            lock(&record).forbid(format!("the CRD {name} was deleted"));
                            notify();
                        }
                        Ok(WatchEvent::Bookmark(bookmark)) => from = bookmark.metadata.resource_version,
                        // 410 Expired (crd-watch-expired.txt) or any other error: the
                        // history from `from` on cannot be had.
                        Ok(WatchEvent::Error(status)) => {
                            gap = Some(format!("{} {}: {}", status.code, status.reason, status.message));
                            break;
                        }
                        // The connection ended: go on from `from`.
                        Err(error) => {
                            debug!(crd = name, error = %error, "the CRD watch ended");
                            break;
                        }
                    }
                    progressed = true;
                }
                gap
            }
            Err(kube::Error::Api(status)) if status.code == 410 => {
                Some(format!("{} {}: {}", status.code, status.reason, status.message))
            }
            Err(error) => {
                if failures == 0 {
                    warn!(crd = name, error = %error, "cannot watch the CRD; retrying");
                }
                None
            }
        };
        if let Some(reason) = gap {
            go_on_after_a_gap(&api, &name, &record, &reason, &mut from, &mut failures).await;
            notify();
        }
        if progressed {
            failures = 0;
        } else {
            // Right after a first gap the list's resourceVersion is fresh: no wait.
            failures = failures.saturating_add(1);
            if failures > 1 {
                tokio::time::sleep(backoff(failures)).await;
            }
        }
    }
}

/// The history since `from` is lost (`reason`): records the gap in `record` and goes on
/// from the CRD as it is now.
async fn go_on_after_a_gap(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    record: &Mutex<Record>,
    reason: &str,
    from: &mut String,
    failures: &mut u32,
) {
    // The history since `from` is lost: go on from the CRD as it is now, watched
    // from the list's resourceVersion (the store's: the CRD's own may be too old to
    // watch from, tests/fixtures/apiserver/crd-list-by-name-after-compaction.txt).
    let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
    let listed = loop {
        match api.list(&by_name).await {
            Ok(listed) => break listed,
            Err(error) => {
                debug!(crd = name, error = %error, "cannot list the CRD after a gap in its watch");
                *failures = failures.saturating_add(1);
                tokio::time::sleep(backoff(*failures)).await;
            }
        }
    };
    if let Some(resource_version) = listed.metadata.resource_version.clone() {
        *from = resource_version;
    }
    match listed
        .items
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
    {
        Some(crd) => lock(record).gap(reason, crd),
        None => lock(record).forbid(format!("the CRD {name} was deleted")),
    }
}

/// 0.2 s doubling to 10 s.
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(200u64.saturating_mul(1 << failures.min(6))).min(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(rv: &str, generation: i64, storage: &str, served: bool) -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "metadata": {"name": "widgets.example.com", "resourceVersion": rv, "generation": generation},
            "spec": {"group": "example.com", "scope": "Namespaced", "names": {"kind": "Widget", "plural": "widgets"},
                     "versions": [{"name": "v1", "served": true, "storage": storage == "v1"},
                                  {"name": "v2", "served": served, "storage": storage == "v2"}]},
        }))
        .expect("crd")
    }

    fn record() -> Record {
        Record {
            crd: "widgets.example.com".into(),
            storage_version: "v2".into(),
            changed: None,
            recent: VecDeque::from(["10".to_owned()]),
            last: Seen {
                resource_version: "10".into(),
                generation: Some(2),
            },
        }
    }

    #[test]
    fn a_flip_away_and_back_is_remembered() {
        let mut record = record();
        record.observe(&crd("11", 3, "v1", true));
        record.observe(&crd("12", 4, "v2", true));
        let changed = record.changed.expect("changed");
        assert!(
            changed.contains("the storage version was v1 instead of v2 at resourceVersion 11"),
            "{changed}"
        );
    }

    #[test]
    fn an_unserved_storage_version_forbids_the_trim() {
        let mut record = record();
        record.observe(&crd("11", 3, "v2", false));
        assert!(record.changed.is_some_and(|c| c.contains("not served")));
    }

    #[test]
    fn a_gap_is_harmless_only_if_the_generation_did_not_move() {
        let mut record = record();
        record.gap("410 Expired: too old", &crd("20", 2, "v2", true));
        assert_eq!(record.changed, None);
        record.gap("410 Expired: too old", &crd("30", 5, "v2", true));
        let changed = record.changed.expect("changed");
        assert!(
            changed.contains("after resourceVersion 20 could not be watched (410 Expired: too old) and its generation moved from 2 to 5"),
            "{changed}"
        );
    }

    #[test]
    fn a_deprecation_leaves_the_storage_alone() {
        let mut record = record();
        record.observe(&crd("11", 3, "v2", true));
        assert_eq!(record.changed, None);
        assert_eq!(record.recent, ["10", "11"]);
    }
}
