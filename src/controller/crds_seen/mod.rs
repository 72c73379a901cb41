//! What this process knows of each CRD: the newest resourceVersion its CRD watch delivered
//! (and its own reads and patches), and, within a memory budget, the CRDs as last read or
//! patched, for a reconcile to read its CRD without a request while the watch is up and saw
//! nothing newer (`reconcile::read::at_least_as_new_as_seen`); and when its watch delivered a version, for a
//! reconcile to know that its patch has reached watchers (`until_watched`).
//!
//! One `CrdsSeen`, one lock over its `State`; each file owns one use of it:
//! - `watch`: what the CRD watch delivers, and whether it is up;
//! - `kept`: the CRDs kept as last read or patched (within the budget), and the tickets
//!   that keep an answer the watch overtook from being recorded;
//! - `until_watched`: a reconcile waiting for the watch to deliver its patch.

mod kept;
mod until_watched;
mod watch;

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::sync::lock;

/// The newest resourceVersion of each CRD this process saw (every CRD of the cluster, a
/// name and a number each), and the CRDs it read or patched last, as JSON.
/// resourceVersions are opaque, so the last one recorded wins: a relist from an apiserver
/// behind may record an older one, which only makes a read less fresh (the CRD patch is
/// guarded by the resourceVersion it decided on, `patch::crd_patch`).
#[derive(Debug, Default)]
pub struct CrdsSeen {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The newest resourceVersion seen, by CRD name.
    seen: HashMap<String, String>,
    /// The last resourceVersion the CRD watch delivered, by CRD name.
    watched: HashMap<String, String>,
    /// Whether a CRD watch feeds this (`watch_event`) and listed every CRD since it started
    /// or relisted. Without one (a bare reconcile's), nothing would tell a kept CRD is stale.
    listed: bool,
    /// When the watch last failed, while it has not shown since that it flows again.
    /// kube-runtime's watcher resumes a failed watch (a 429 or 5xx as it starts) from its
    /// last resourceVersion without listing again, so no `InitDone` says it is back: an
    /// event delivered since does, and so does `RESUMED_AFTER` without a new failure (the
    /// watcher retries at most every 30 s plus jitter, and reports each failure).
    failed_at: Option<tokio::time::Instant>,
    /// Reconciles waiting for the watch to deliver a resourceVersion, by CRD name.
    waiting: HashMap<String, Vec<(String, oneshot::Sender<()>)>>,
    /// CRDs as last read or patched, as JSON (a decoded schema takes many times its JSON
    /// size), by name, with their resourceVersion.
    kept: HashMap<String, (String, Vec<u8>)>,
    /// What `kept` holds, in bytes.
    kept_bytes: usize,
    /// The most `kept` may hold (`KEPT_CRDS_AT_MOST` when unset).
    budget: Option<usize>,
    /// How many deliveries the CRD watch made so far, and the number of each CRD's last
    /// (for `Ticket`).
    deliveries: u64,
    delivered_at: HashMap<String, u64>,
    /// The CRDs a relist under way delivered so far: those it did not deliver were deleted
    /// while the watch was away, and are forgotten as it ends (`InitDone`).
    relisted: Option<std::collections::HashSet<String>>,
    /// The last `RECENT_DELIVERIES` deliveries (CRD name, resourceVersion): a patch whose
    /// event the watch delivered before its reconcile came to wait for it, and then a later
    /// one, has been delivered all the same.
    recent: VecDeque<(String, String)>,
}

/// How long a failed CRD watch, resumed by kube-runtime's watcher without a relist, must
/// go without failing again (and without delivering) to count as up again.
const RESUMED_AFTER: Duration = Duration::from_secs(120);

/// How many of the CRD watch's last deliveries `until_watched` looks back on.
const RECENT_DELIVERIES: usize = 256;

/// Taken before a request for a CRD is sent (`CrdsSeen::ticket`): its answer is recorded
/// and kept only if the CRD watch delivered nothing for that CRD while it was in flight. An
/// answer overtaken by a watch event may be older than it (resourceVersions are opaque, so
/// they cannot be compared): recording it would serve the older copy to the next reconcile,
/// which would compute no change from it, and nothing would correct that until another
/// write.
#[derive(Clone, Copy, Debug)]
pub struct Ticket(u64);

impl CrdsSeen {
    /// Taken before sending a request for a CRD whose answer goes to `refresh` or `keep`.
    pub fn ticket(&self) -> Ticket {
        Ticket(lock(&self.state).deliveries)
    }

    /// The resourceVersion `name` was last seen at.
    pub fn get(&self, name: &str) -> Option<String> {
        lock(&self.state).seen.get(name).cloned()
    }
}

fn record_in(map: &mut HashMap<String, String>, name: &str, resource_version: &str) {
    match map.get_mut(name) {
        Some(known) if known == resource_version => {}
        Some(known) => resource_version.clone_into(known),
        None => {
            map.insert(name.to_owned(), resource_version.to_owned());
        }
    }
}

/// What the tests of every part build on.
#[cfg(test)]
mod testing {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::runtime::watcher;

    use super::CrdsSeen;

    /// The CRD watch listed every CRD.
    pub(super) fn up(seen: &CrdsSeen) {
        seen.watch_event(&Ok(watcher::Event::InitDone));
    }

    pub(super) fn crd(name: &str, version: &str) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": version},
            "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"},
                     "scope": "Namespaced", "versions": []}}))
        .expect("a CRD")
    }
}
