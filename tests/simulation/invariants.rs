//! What must hold after every step, read from the fake's storage (its etcd: which version each
//! object's bytes are encoded in, the CRD as stored), never from what the controller
//! believes. The checker runs inside the fake after every request it answers and after every
//! change another writer makes (`State::step`), so a state that lasts one step is seen.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::apiserver::State;

pub const CRD: &str = "widgets.example.com";

/// More steps than this at one instant of the paused clock is a loop that never waits.
const HOT_LOOP_STEPS: u64 = 5_000;

/// What a run found, shared by the checker and the run.
#[derive(Default)]
pub struct Findings {
    /// Broken invariants, each with the second it broke at.
    pub violations: Vec<String>,
    /// Every change of the CRD's versions, storage or `storedVersions`, and every fault and
    /// write of another actor, in order: what a violation is explained by.
    pub trace: Vec<String>,
    /// The seconds since the start, as the run last set them (for the trace).
    pub now: f64,
    /// Versions someone else's migration trimmed while objects were stored in them, which
    /// the controller cannot see (`checker`).
    pub excused: BTreeSet<String>,
}

impl Findings {
    pub fn note(&mut self, line: String) {
        let line = format!("{:>8.3}s {line}", self.now);
        self.trace.push(line);
    }

    pub fn violation(&mut self, what: String) {
        let line = format!("{:>8.3}s VIOLATION {what}", self.now);
        self.trace.push(line.clone());
        self.violations.push(line);
    }
}

/// The CRD as far as the invariants care.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shape {
    /// Every version in `spec.versions`, with (served, storage).
    versions: BTreeMap<String, (bool, bool)>,
    stored: Vec<String>,
}

impl Shape {
    fn of(crd: &Value) -> Shape {
        let versions = crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| {
                (
                    v["name"].as_str().unwrap_or_default().to_owned(),
                    (v["served"] == true, v["storage"] == true),
                )
            })
            .collect();
        let stored = crd["status"]["storedVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        Shape { versions, stored }
    }

    fn storage(&self) -> Vec<&str> {
        self.versions
            .iter()
            .filter(|(_, (_, storage))| *storage)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    fn describe(&self) -> String {
        let served: Vec<&str> = self
            .versions
            .iter()
            .filter(|(_, (served, _))| *served)
            .map(|(n, _)| n.as_str())
            .collect();
        format!(
            "versions [{}] served [{}] storage [{}] storedVersions [{}]",
            self.versions.keys().cloned().collect::<Vec<_>>().join(", "),
            served.join(", "),
            self.storage().join(", "),
            self.stored.join(", ")
        )
    }
}

/// Objects of the CRD by the version they are encoded in, and the versions their
/// managedFields name.
fn encodings(state: &State) -> (BTreeMap<String, usize>, BTreeSet<String>) {
    let mut counts = BTreeMap::new();
    let mut named = BTreeSet::new();
    for ((crd, _, _), object) in &state.objects {
        if crd != CRD {
            continue;
        }
        *counts.entry(object.encoded_as.clone()).or_default() += 1;
        for entry in &object.managed_fields {
            if let Some((_, version)) = entry["apiVersion"].as_str().and_then(|a| a.rsplit_once('/')) {
                named.insert(version.to_owned());
            }
        }
    }
    (counts, named)
}

/// Whether `actor`'s trims are the controller's doing: its own requests, and Kubernetes'
/// migrator finishing a migration the controller created and that succeeded (it trims
/// `storedVersions` on the controller's word). A failed migration's trim is Kubernetes' own
/// (recorded: tests/fixtures/svm-failed-trims-stored-versions.txt); what the controller owes
/// after it is never to remove the version, checked below.
fn answers_for_trims(actor: &str) -> bool {
    is_replica(actor)
        || actor == CHECK_FIX
        || actor.starts_with("kubernetes: the controller's StorageVersionMigration")
}

/// The actor of `crd-lifecycle check --fix`: this project's code too, so its trims count as
/// the controller's.
pub const CHECK_FIX: &str = "crd-lifecycle check --fix";

/// Whether `actor` is one of the controller's replicas ("controller", "controller-b").
pub fn is_replica(actor: &str) -> bool {
    actor == "controller" || actor.starts_with("controller-")
}

/// A write by a replica whose lease had expired (or that never held it), where replicas
/// elect a leader: the others may lead by then (they take over a lease left unrenewed for
/// its duration), so two writers would act at once.
fn unfenced_write(state: &State, actor: &str) -> Option<String> {
    if !state.fenced || !is_replica(actor) {
        return None;
    }
    let (method, path) = state.current_write.as_ref()?;
    if path.starts_with("/apis/coordination.k8s.io/") {
        return None;
    }
    // Every replica, leader or not, keeps its webhook's certificate and its entry of the
    // rotation record in the webhook's Secret (guarded by its resourceVersion); the CRDs'
    // `caBundle` is the leader's to write, and checked.
    if path.starts_with(&format!(
        "/api/v1/namespaces/{}/secrets",
        crate::webhook::NAMESPACE
    )) {
        return None;
    }
    let now = tokio::time::Instant::now();
    match state.lease_held.get(actor) {
        None => Some(format!(
            "{actor} wrote ({method} {path}) without ever holding the lease"
        )),
        Some((at, duration)) if duration.is_zero() && now >= *at => Some(format!(
            "{actor} wrote ({method} {path}) {:.3}s after its lease went to another holder (or was released)",
            (now - *at).as_secs_f64()
        )),
        Some((at, duration)) if now >= *at + *duration => Some(format!(
            "{actor} wrote ({method} {path}) {:.3}s after its lease was last renewed, which is valid {}s: its lease \
             had expired, another replica may lead",
            (now - *at).as_secs_f64(),
            duration.as_secs()
        )),
        Some(_) => None,
    }
}

/// The checker the fake calls after every step.
pub fn checker(findings: Arc<Mutex<Findings>>) -> crate::apiserver::Checker {
    let mut last: Option<Shape> = None;
    let mut refusals = 0;
    let mut instant = (tokio::time::Instant::now(), 0u64);
    let mut idle_runs = IdleRuns::default();
    Box::new(move |state: &State| {
        let mut findings = findings.lock().unwrap_or_else(|p| p.into_inner());
        // Steps at one instant of the paused clock: a loop that never waits for time.
        let now = tokio::time::Instant::now();
        if instant.0 == now {
            instant.1 += 1;
        } else {
            instant = (now, 1);
        }
        if instant.1 == HOT_LOOP_STEPS {
            findings.violation(format!(
                "{HOT_LOOP_STEPS} steps at one instant: a loop that never waits (last actor {})",
                state.actor
            ));
            // The fake answers nothing more: the loop stops, time goes on, the run ends.
            return true;
        }
        let actor = state.actor.clone();
        if let Some(write) = unfenced_write(state, &actor) {
            findings.violation(write);
        }
        if state.refused_stored_version_drops.len() > refusals {
            for (sender, refusal) in &state.refused_stored_version_drops[refusals..] {
                if is_replica(sender) {
                    findings.violation(format!(
                        "the apiserver refused a CRD patch that drops a stored version ({refusal})"
                    ));
                } else {
                    findings.note(format!("the apiserver refused {sender}'s CRD write ({refusal})"));
                }
            }
            refusals = state.refused_stored_version_drops.len();
        }
        let Some(crd) = state.crds.get(CRD) else {
            return false;
        };
        if let Some(waste) = idle_runs.check(state, crd) {
            findings.violation(waste);
        }
        let shape = Shape::of(crd);
        if last.as_ref() == Some(&shape) {
            return false;
        }
        findings.note(format!("{actor}: {}", shape.describe()));
        let (objects, named) = encodings(state);
        let storage = shape.storage();
        if is_replica(&actor) {
            match storage.as_slice() {
                [one] if shape.versions[*one].0 => {}
                [one] => findings.violation(format!("the controller left storage version {one} unserved")),
                many => findings.violation(format!("storage versions [{}]", many.join(", "))),
            }
        }
        if let Some(before) = &last {
            for version in before.stored.iter().filter(|v| !shape.stored.contains(v)) {
                let held = objects.get(version).copied().unwrap_or(0);
                if held == 0 {
                    continue;
                }
                if actor.starts_with("kubernetes: another's StorageVersionMigration") {
                    // Kubernetes' migrator succeeded through an apiserver that had not acted
                    // on the switch (it has no settle of its own) and trimmed: nothing the
                    // controller can see tells it objects are left. Not its doing, and
                    // neither is their version's later removal.
                    findings.excused.insert(version.clone());
                    findings.note(format!(
                        "{actor} trimmed {version} from status.storedVersions while {held} objects are stored in it \
                         (Kubernetes' migrator without a settle; nothing the controller can see shows it)"
                    ));
                } else if answers_for_trims(&actor) {
                    findings.violation(format!(
                        "{actor} trimmed {version} from status.storedVersions while {held} objects are stored in it"
                    ));
                } else {
                    findings.note(format!(
                        "{actor} trimmed {version} from status.storedVersions while {held} objects are stored in it \
                         (not the controller's doing: it must never remove {version} now)"
                    ));
                }
            }
            for version in before
                .versions
                .keys()
                .filter(|v| !shape.versions.contains_key(*v))
            {
                let held = objects.get(version).copied().unwrap_or(0);
                if held > 0 && findings.excused.contains(version) {
                    findings.note(format!(
                        "{actor} removed {version} while {held} objects are stored in it (left there by another's \
                         migration, unseen)"
                    ));
                } else if held > 0 {
                    findings.violation(format!(
                        "{actor} removed {version} from spec.versions while {held} objects are stored in it (they \
                         can no longer be read)"
                    ));
                }
                if named.contains(version) && is_replica(&actor) {
                    findings.violation(format!(
                        "{actor} removed {version} while managedFields name it: server-side apply fails for every \
                         manager of those objects (apiserver-samples/29)"
                    ));
                }
            }
        }
        last = Some(shape);
        false
    })
}

/// Migration runs of the policy that found nothing to migrate (`Succeeded`, nothing listed:
/// `status.storedVersions` named the storage version alone when the run read it), by the CRD
/// state they ended at. One such run is a race the controller cannot avoid (it decided on a
/// CRD copy a moment before someone else's trim landed); a second one at the same CRD state
/// means the controller started a run it had just learnt was pointless: a loop of runs, each
/// with its Events and status writes, while its view of the CRD lags (the kept-copy check in
/// `reconcile/background.rs`, `stored_versions_untrimmed`).
#[derive(Default)]
struct IdleRuns {
    /// The policy's `status.migration` at the last step.
    last: Value,
    /// The CRD's resourceVersion at the end of each idle run seen, with the run's start.
    ended_at: Vec<(String, String)>,
}

impl IdleRuns {
    fn check(&mut self, state: &State, crd: &Value) -> Option<String> {
        let migration = &state.policies.values().next()?["status"]["migration"];
        if *migration == self.last {
            return None;
        }
        self.last = migration.clone();
        // Found nothing to migrate (`AlreadyMigrated`): nothing listed and no `rewroteAll`,
        // which a run that trimmed sets even over no objects.
        if migration["phase"] != "Succeeded"
            || migration["listed"] != 0
            || migration["total"] != 0
            || migration.get("rewroteAll").is_some()
        {
            return None;
        }
        let started = migration["startedAt"].as_str().unwrap_or_default().to_owned();
        let version = crd["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let earlier = self
            .ended_at
            .iter()
            .find(|(at, _)| *at == version)
            .map(|(_, started)| started.clone());
        self.ended_at.push((version.clone(), started.clone()));
        earlier.map(|earlier| {
            format!(
                "a migration run started at {started} found nothing to migrate, as one started at {earlier} had, \
                 with the CRD unchanged since (resourceVersion {version}): a run started on what the controller had \
                 just learnt"
            )
        })
    }
}

/// The end state the policy schedules once every milestone passed: v1 alone, served and
/// stored, and every object in it. `None` when it holds, else what differs.
pub fn scheduled_end_missed(state: &State, excused: &BTreeSet<String>) -> Option<String> {
    let crd = state.crds.get(CRD)?;
    let shape = Shape::of(crd);
    let (mut objects, named) = encodings(state);
    objects.retain(|v, _| !excused.contains(v));
    let want_versions: BTreeMap<String, (bool, bool)> = [("v1".to_owned(), (true, true))].into();
    let mut missed = Vec::new();
    if shape.versions != want_versions || shape.stored != ["v1"] {
        missed.push(shape.describe());
    }
    if objects.keys().any(|v| v != "v1") {
        missed.push(format!("objects stored as {objects:?}"));
    }
    if named.iter().any(|v| v != "v1") {
        missed.push(format!("managedFields name {named:?}"));
    }
    (!missed.is_empty()).then(|| missed.join("; "))
}

/// Objects stored in a version `status.storedVersions` does not list, or the CRD does not
/// have (unreadable): at the end, whoever trimmed, nothing may be left so.
pub fn stored_outside(state: &State, excused: &BTreeSet<String>) -> Option<String> {
    let crd = state.crds.get(CRD)?;
    let shape = Shape::of(crd);
    let (objects, _) = encodings(state);
    let outside: Vec<String> = objects
        .iter()
        .filter(|(v, _)| !excused.contains(*v))
        .filter(|(v, _)| !shape.stored.contains(v) || !shape.versions.contains_key(*v))
        .map(|(v, n)| format!("{n} in {v}"))
        .collect();
    (!outside.is_empty()).then(|| {
        format!(
            "objects stored outside status.storedVersions: {}",
            outside.join(", ")
        )
    })
}
