//! The soak: proves that nothing is lost or converted wrong while everything that can restart
//! does. A CRD with three versions converts through the declarative webhook, served by two
//! controller replicas (leader election) behind a load balancer; hundreds of objects; clients
//! create, update, read (GET, paged LIST, watch) and delete through every version, checking
//! every object they read against the content expected in that version, computed from the
//! policy's own conversion rules. Meanwhile the policy walks introduce → store → deprecate →
//! unserve → remove on a timeline compressed to `SOAK_SECONDS` (default 120), and the test
//! SIGKILLs and SIGTERMs the leader, restarts the other replica (a webhook replica), rotates the
//! webhook's CA, restarts the apiserver and compacts etcd (the last two only on a control plane
//! the suite started). It ends with every migration finished, `storedVersions` trimmed, the old
//! version removed, and one summary line; it fails on any lost object, any wrong read, and any
//! write refused through a version that was served at that moment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::Timestamp;
use kube::Client;
use serde_json::{Value, json};

use crate::balancer::Balancer;
use crate::ensure;
use crate::env::{Env, Outcome, TestCrd, lock, wait_for};
use crate::replicas::Replica;

const VERSIONS: [&str; 3] = ["v1alpha1", "v1beta1", "v1"];

/// How late after its instant a transition may still be landing (the controller's 2 s and a
/// margin for a reconcile that was busy).
const LANDING: Duration = Duration::from_secs(5);

/// The policy's conversion between the versions: a rename, an added default, a removed field,
/// a nested move and a CEL type change (the `conversion_webhook` scenario's).
fn conversion() -> Value {
    json!({
        "webhook": {"enabled": true},
        "changes": [
            {"from": "v1alpha1", "to": "v1beta1",
             "renamed": [{"from": "spec.size", "to": "spec.replicas"}],
             "added": [{"path": "spec.color", "default": "blue"}],
             "removed": ["spec.legacyMode"]},
            {"from": "v1beta1", "to": "v1", "renamed": [{"from": "spec.replicas", "to": "spec.scale.replicas"}],
             "changed": [{"path": "spec.port", "upgrade": "int(self)", "downgrade": "string(self)"}]},
        ]
    })
}

/// A small deterministic generator (xorshift), seeded per worker from the printed run seed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// When each version is served, by the policy's schedule.
#[derive(Clone, Copy)]
struct Schedule {
    introduce_v1: Timestamp,
    store_v1: Timestamp,
    deprecate_v1alpha1: Timestamp,
    unserve_v1alpha1: Timestamp,
    remove_v1alpha1: Timestamp,
}

impl Schedule {
    /// Whether a 404 (the version not served) for a request answered at `now` through
    /// `version` is what the schedule says: before a version is introduced (or while its
    /// introduction is landing), and from its unserve on.
    fn may_be_unserved(&self, version: &str, now: Timestamp) -> bool {
        let landing = jiff::SignedDuration::try_from(LANDING).unwrap_or_default();
        match version {
            "v1" => now < self.introduce_v1 + landing,
            "v1alpha1" => now >= self.unserve_v1alpha1,
            _ => false,
        }
    }
}

/// What the test knows of one object: the bodies written, by the generation they produce.
#[derive(Default)]
struct Truth {
    /// generation → the object as sent (in the version it was written through).
    written: BTreeMap<i64, Value>,
    /// The generation of the last write known to have landed.
    current: i64,
    /// Deleted (or a delete whose answer was lost: it may still be there).
    deleted: bool,
    delete_unsure: bool,
}

#[derive(Default)]
struct Counts {
    reads: AtomicU64,
    writes: AtomicU64,
    conversions_checked: AtomicU64,
    watch_events: AtomicU64,
    refused_unserved: AtomicU64,
    conflicts: AtomicU64,
    transient: AtomicU64,
    /// Continued list pages refused because their snapshot predates the migration.
    stale_snapshot_pages: AtomicU64,
}

/// Everything the clients share.
struct Soak {
    client: Client,
    group: String,
    converter: crd_lifecycle::conversion::Converter,
    schedule: Schedule,
    truth: Mutex<BTreeMap<String, Truth>>,
    counts: Counts,
    /// Problems found: wrong reads, lost objects, refused writes (capped when reported).
    problems: Mutex<Vec<String>>,
    /// Set while the apiserver restarts (and a moment after): requests may fail meanwhile.
    apiserver_down: AtomicBool,
    /// When a replica was last killed (SIGKILL): its in-flight conversions may fail for a
    /// moment, as a pod killed without a drain drops its requests.
    killed_at: Mutex<Option<Instant>>,
    stop: AtomicBool,
    /// The suite's own etcd, to tell what is stored when a read fails.
    etcd: Option<crate::control_plane::Etcd>,
    diagnosed_at: Mutex<Option<Instant>>,
    /// Failures excused (the apiserver restarting, a replica killed): how many of each kind,
    /// and when the first was, for the summary.
    excused_failures: Mutex<BTreeMap<String, (u64, Timestamp)>>,
}

/// How a request ended, as the soak classifies it.
enum Answer {
    Ok(Value),
    /// A plain-text 404: the version is not served (apiserver-samples/15).
    Unserved,
    /// A Status 404: the object does not exist.
    NotFound,
    Conflict,
    /// No answer, or an error that may pass (the apiserver restarting, a killed replica).
    Failed(String),
}

impl Soak {
    fn path(&self, version: &str, name: Option<&str>) -> String {
        match name {
            Some(name) => format!("/apis/{}/{version}/widgets/{name}", self.group),
            None => format!("/apis/{}/{version}/widgets", self.group),
        }
    }

    fn problem(&self, text: String) {
        let mut problems = lock(&self.problems);
        if problems.len() < 1000 {
            problems.push(format!("{text} (at {})", Timestamp::now()));
        }
    }

    /// What etcd holds that is not in the storage version, when a read failed because an
    /// object was stored in a version the CRD no longer has (at most once a second).
    async fn diagnose_storage(&self) {
        let Some(etcd) = self.etcd else { return };
        {
            let mut last = lock(&self.diagnosed_at);
            if last.is_some_and(|at| at.elapsed() < Duration::from_secs(1)) {
                return;
            }
            *last = Some(Instant::now());
        }
        let prefix = format!("/registry/{}/widgets/", self.group);
        match etcd.list(&prefix).await {
            Ok(stored) => {
                let stale: Vec<String> = stored
                    .iter()
                    .filter(|(_, object)| object["apiVersion"] != format!("{}/v1", self.group).as_str())
                    .map(|(key, object)| format!("{} as {}", key.trim_start_matches(&prefix), object["apiVersion"]))
                    .collect();
                self.problem(format!(
                    "diagnosis: etcd holds {} objects, {} not as v1: {}",
                    stored.len(),
                    stale.len(),
                    stale.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
                ));
            }
            Err(error) => self.problem(format!("diagnosis: cannot list etcd: {error}")),
        }
    }

    /// Whether a failure now may be transient (the apiserver restarting, a replica killed in
    /// the last two seconds).
    fn excused(&self) -> bool {
        self.apiserver_down.load(Ordering::Relaxed)
            || lock(&self.killed_at).is_some_and(|at| at.elapsed() < Duration::from_secs(2))
    }

    async fn send(&self, method: http::Method, path: &str, body: Option<&Value>) -> Answer {
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(body.map(|b| serde_json::to_vec(b).unwrap_or_default()).unwrap_or_default());
        let Ok(request) = request else {
            return Answer::Failed("cannot build the request".to_owned());
        };
        let response = tokio::time::timeout(
            Duration::from_secs(30),
            self.client.send(request.map(kube::client::Body::from)),
        )
        .await;
        let response = match response {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Answer::Failed(error.to_string()),
            Err(_) => return Answer::Failed("no answer within 30 s".to_owned()),
        };
        let status = response.status().as_u16();
        let bytes = match response.into_body().collect_bytes().await {
            Ok(bytes) => bytes,
            Err(error) => return Answer::Failed(error.to_string()),
        };
        let value: Option<Value> = serde_json::from_slice(&bytes).ok();
        match (status, value) {
            (200..=299, Some(value)) => Answer::Ok(value),
            (404, Some(status)) if status["kind"] == "Status" => Answer::NotFound,
            (404, _) => Answer::Unserved,
            (409, _) => Answer::Conflict,
            (code, value) => Answer::Failed(format!(
                "{code}: {}",
                value.map_or_else(|| String::from_utf8_lossy(&bytes).into_owned(), |v| v["message"].to_string())
            )),
        }
    }

    /// The spec `object` (written through its own version) has when read through `version`.
    fn expected(&self, written: &Value, version: &str) -> Result<Value, String> {
        self.converter
            .convert(written, version)
            .map(|o| o["spec"].clone())
            .map_err(|e| e.to_string())
    }

    /// Checks an object read through `version` against what was written.
    fn check(&self, object: &Value, version: &str, how: &str) {
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
        let api_version = format!("{}/{version}", self.group);
        if object["apiVersion"] != api_version.as_str() {
            self.problem(format!(
                "wrong: {how} {name} through {version} came back as {}",
                object["apiVersion"]
            ));
            return;
        }
        let written = {
            let truth = lock(&self.truth);
            let Some(known) = truth.get(&name) else {
                drop(truth);
                self.problem(format!("wrong: {how} through {version} returned {name}, which was never written"));
                return;
            };
            known.written.get(&generation).cloned()
        };
        let Some(written) = written else {
            self.problem(format!(
                "wrong: {how} {name} through {version} has generation {generation}, never written"
            ));
            return;
        };
        if written["apiVersion"] != api_version.as_str() {
            self.counts.conversions_checked.fetch_add(1, Ordering::Relaxed);
        }
        match self.expected(&written, version) {
            Ok(expected) if expected == object["spec"] => {}
            Ok(expected) => self.problem(format!(
                "wrong: {how} {name} (generation {generation}, written through {}) through {version}: spec {} expected {expected}",
                written["apiVersion"], object["spec"]
            )),
            Err(error) => self.problem(format!("cannot compute {name} in {version}: {error}")),
        }
    }

    /// A spec in `version`'s shape.
    fn spec(version: &str, replicas: u64, random: &mut Random) -> Value {
        let port = 8000 + random.below(100);
        let padded = if random.below(3) == 0 {
            format!("0{port}")
        } else {
            port.to_string()
        };
        let colors = ["blue", "red", "green"];
        let color = colors[random.below(3) as usize];
        match version {
            "v1alpha1" => json!({"size": replicas, "legacyMode": random.below(2) == 0, "port": padded}),
            "v1beta1" => json!({"replicas": replicas, "color": color, "port": padded}),
            _ => json!({"scale": {"replicas": replicas}, "color": color, "port": port}),
        }
    }

    /// Counts a 404 for an unserved version: expected if the schedule says it may be
    /// unserved now, else a refusal through a served version.
    fn unserved(&self, version: &str, what: &str) {
        if self.schedule.may_be_unserved(version, Timestamp::now()) {
            self.counts.refused_unserved.fetch_add(1, Ordering::Relaxed);
        } else {
            self.problem(format!("refused: {what} through {version} answered 404 while {version} is served"));
        }
    }

    async fn failed(&self, version: &str, what: &str, message: &str) {
        if message.contains("invalid group/version") {
            self.diagnose_storage().await;
        }
        if self.excused() {
            self.counts.transient.fetch_add(1, Ordering::Relaxed);
            let mut excused = lock(&self.excused_failures);
            let kind: String = message.chars().take(60).collect();
            let entry = excused.entry(kind).or_insert((0, Timestamp::now()));
            entry.0 += 1;
        } else {
            self.problem(format!("refused: {what} through {version}: {message}"));
        }
        // A client backs off after a failure instead of hammering a restarting apiserver.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    async fn create(&self, name: &str, version: &str, random: &mut Random) {
        let body = json!({"apiVersion": format!("{}/{version}", self.group), "kind": "Widget",
                          "metadata": {"name": name}, "spec": Self::spec(version, 1, random)});
        lock(&self.truth)
            .entry(name.to_owned())
            .or_default()
            .written
            .insert(1, body.clone());
        match self.send(http::Method::POST, &self.path(version, None), Some(&body)).await {
            Answer::Ok(created) => {
                self.counts.writes.fetch_add(1, Ordering::Relaxed);
                if let Some(known) = lock(&self.truth).get_mut(name) {
                    known.current = 1;
                }
                self.check(&created, version, "create");
            }
            Answer::Unserved => self.forget(name, 1, || self.unserved(version, "create")),
            Answer::Conflict => self.problem(format!("create {name}: already exists")),
            Answer::NotFound => self.problem(format!("create {name} through {version}: 404 Status")),
            // The create may have landed: a later read tells (generation 1 is expected).
            Answer::Failed(message) => self.failed(version, &format!("create {name}"), &message).await,
        }
    }

    /// Forgets a write that certainly did not land.
    fn forget(&self, name: &str, generation: i64, then: impl FnOnce()) {
        if let Some(known) = lock(&self.truth).get_mut(name)
            && known.current < generation
        {
            known.written.remove(&generation);
        }
        then();
    }

    async fn update(&self, name: &str, version: &str, random: &mut Random) {
        let current = match self.send(http::Method::GET, &self.path(version, Some(name)), None).await {
            Answer::Ok(object) => object,
            Answer::Unserved => return self.unserved(version, &format!("get {name} (to update)")),
            Answer::NotFound => return self.not_found(name, version),
            Answer::Conflict => return,
            Answer::Failed(message) => return self.failed(version, &format!("get {name}"), &message).await,
        };
        self.counts.reads.fetch_add(1, Ordering::Relaxed);
        self.check(&current, version, "get");
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(0);
        let mut body = current.clone();
        body["spec"] = Self::spec(version, u64::try_from(generation).unwrap_or(0) + 1, random);
        let next = generation + 1;
        lock(&self.truth)
            .entry(name.to_owned())
            .or_default()
            .written
            .insert(next, body.clone());
        match self.send(http::Method::PUT, &self.path(version, Some(name)), Some(&body)).await {
            Answer::Ok(updated) => {
                self.counts.writes.fetch_add(1, Ordering::Relaxed);
                if let Some(known) = lock(&self.truth).get_mut(name) {
                    known.current = known.current.max(next);
                }
                self.check(&updated, version, "update");
            }
            Answer::Conflict => self.forget(name, next, || {
                self.counts.conflicts.fetch_add(1, Ordering::Relaxed);
            }),
            Answer::Unserved => self.forget(name, next, || self.unserved(version, &format!("update {name}"))),
            Answer::NotFound => self.not_found(name, version),
            Answer::Failed(message) => self.failed(version, &format!("update {name}"), &message).await,
        }
    }

    fn not_found(&self, name: &str, version: &str) {
        let truth = lock(&self.truth);
        let gone = truth.get(name).is_none_or(|t| t.deleted || t.delete_unsure || t.current == 0);
        drop(truth);
        if !gone {
            self.problem(format!("lost: {name} answered NotFound through {version}"));
        }
    }

    async fn get(&self, name: &str, version: &str) {
        match self.send(http::Method::GET, &self.path(version, Some(name)), None).await {
            Answer::Ok(object) => {
                self.counts.reads.fetch_add(1, Ordering::Relaxed);
                if lock(&self.truth).get(name).is_some_and(|t| t.deleted && !t.delete_unsure) {
                    self.problem(format!("wrong: {name} reads through {version} after it was deleted"));
                } else {
                    self.check(&object, version, "get");
                }
            }
            Answer::Unserved => self.unserved(version, &format!("get {name}")),
            Answer::NotFound => self.not_found(name, version),
            Answer::Conflict => {}
            Answer::Failed(message) => self.failed(version, &format!("get {name}"), &message).await,
        }
    }

    async fn list(&self, version: &str) {
        let mut token = String::new();
        loop {
            let mut path = format!("{}?limit=50", self.path(version, None));
            if !token.is_empty() {
                path.push_str(&format!("&continue={token}"));
            }
            match self.send(http::Method::GET, &path, None).await {
                Answer::Ok(list) => {
                    for item in list["items"].as_array().into_iter().flatten() {
                        self.counts.reads.fetch_add(1, Ordering::Relaxed);
                        self.check(item, version, "list");
                    }
                    token = list["metadata"]["continue"].as_str().unwrap_or_default().to_owned();
                    if token.is_empty() {
                        return;
                    }
                }
                Answer::Unserved => return self.unserved(version, "list"),
                // An expired continue token (410, after a compaction) ends this listing.
                Answer::Failed(message) if message.starts_with("410") => return,
                // A continued list reads etcd at the revision of its first page. Begun before
                // the migration rewrote every object and continued after the old version was
                // removed, it meets objects as they were then, in a version the CRD no longer
                // has, and the apiserver answers 500 until etcd compacts that revision. What
                // is stored now is checked elsewhere (a first page, GETs, etcd itself).
                Answer::Failed(message) if !token.is_empty() && message.contains("from an invalid group/version") => {
                    self.counts.stale_snapshot_pages.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Answer::Failed(message) => return self.failed(version, "list", &message).await,
                Answer::NotFound | Answer::Conflict => return,
            }
        }
    }

    async fn delete(&self, name: &str, version: &str) {
        if let Some(known) = lock(&self.truth).get_mut(name) {
            known.delete_unsure = true;
        }
        match self.send(http::Method::DELETE, &self.path(version, Some(name)), None).await {
            Answer::Ok(_) | Answer::NotFound => {
                self.counts.writes.fetch_add(1, Ordering::Relaxed);
                if let Some(known) = lock(&self.truth).get_mut(name) {
                    known.deleted = true;
                    known.delete_unsure = false;
                }
            }
            Answer::Unserved => {
                if let Some(known) = lock(&self.truth).get_mut(name) {
                    known.delete_unsure = false;
                }
                self.unserved(version, &format!("delete {name}"));
            }
            Answer::Conflict => {}
            Answer::Failed(message) => self.failed(version, &format!("delete {name}"), &message).await,
        }
    }

    /// One client: creates, updates and deletes the objects it owns (`s<worker>-<n>`), reads
    /// any, through random versions, until stopped.
    async fn worker(self: Arc<Self>, worker: u64, seed: u64, mut owned: Vec<String>) {
        let mut random = Random(seed ^ (worker + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut created = owned.len();
        while !self.stop.load(Ordering::Relaxed) {
            let version = VERSIONS[random.below(3) as usize];
            let pick = random.below(100);
            let any_name = {
                let truth = lock(&self.truth);
                let n = random.below(truth.len() as u64) as usize;
                truth.keys().nth(n).cloned()
            };
            match pick {
                0..=9 => {
                    let name = format!("s{worker}-{created:04}");
                    created += 1;
                    self.create(&name, version, &mut random).await;
                    owned.push(name);
                }
                10..=39 if !owned.is_empty() => {
                    let name = owned[random.below(owned.len() as u64) as usize].clone();
                    self.update(&name, version, &mut random).await;
                }
                40..=42 if owned.len() > 10 => {
                    let name = owned.swap_remove(random.below(owned.len() as u64) as usize);
                    self.delete(&name, version).await;
                }
                43..=47 => self.list(version).await,
                _ => {
                    if let Some(name) = any_name {
                        self.get(&name, version).await;
                    }
                }
            }
        }
    }

    /// Watches through `version` (relisting after errors, as informers do) and checks every
    /// object an event carries.
    async fn watcher(self: Arc<Self>, version: &'static str) {
        let resource = kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(&self.group, version, "Widget"),
            "widgets",
        );
        let api: kube::Api<kube::core::DynamicObject> = kube::Api::all_with(self.client.clone(), &resource);
        let config = kube::runtime::watcher::Config::default().page_size(100);
        let mut stream = kube::runtime::watcher(api, config).boxed();
        while !self.stop.load(Ordering::Relaxed) {
            let next = tokio::time::timeout(Duration::from_secs(1), stream.next()).await;
            let event = match next {
                Ok(Some(Ok(event))) => event,
                // Errors (version not served yet, apiserver restarting, 410) relist after a
                // pause, as an informer would.
                Ok(Some(Err(_))) => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                Ok(None) => return,
                Err(_) => continue,
            };
            let objects = match event {
                kube::runtime::watcher::Event::Apply(object)
                | kube::runtime::watcher::Event::InitApply(object) => vec![object],
                _ => Vec::new(),
            };
            for object in objects {
                let Ok(value) = serde_json::to_value(&object) else { continue };
                // An event may carry an object deleted since (the stream lags): only its
                // content is checked.
                self.counts.watch_events.fetch_add(1, Ordering::Relaxed);
                self.check(&value, version, "watch");
            }
        }
    }
}

/// Writes the webhook's certificate files the way the kubelet updates a Secret volume: into a
/// new directory, then one atomic swap of the `..data` link that `tls.crt`, `tls.key` and
/// `ca.crt` point through, so that no reader sees a new certificate with an old CA.
fn write_certificates(dir: &Path, generation: u32) -> Result<String, String> {
    let bundle = crd_lifecycle::webhook::certs::new_bundle(&["127.0.0.1".to_owned()], Timestamp::now())
        .map_err(|e| e.to_string())?;
    let versioned = dir.join(format!("..{generation}"));
    std::fs::create_dir_all(&versioned).map_err(|e| e.to_string())?;
    for (file, text) in [
        ("tls.crt", &bundle.cert_pem),
        ("tls.key", &bundle.key_pem),
        ("ca.crt", &bundle.ca_pem),
    ] {
        std::fs::write(versioned.join(file), text).map_err(|e| e.to_string())?;
        let link = dir.join(file);
        if !link.exists() {
            std::os::unix::fs::symlink(Path::new("..data").join(file), &link).map_err(|e| e.to_string())?;
        }
    }
    let staged = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&staged);
    std::os::unix::fs::symlink(format!("..{generation}"), &staged).map_err(|e| e.to_string())?;
    std::fs::rename(&staged, dir.join("..data")).map_err(|e| e.to_string())?;
    Ok(bundle.ca_pem)
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

pub async fn soak(env: &Env) -> Outcome {
    // The suite's own controller runs without leader election: it must not act meanwhile.
    env.kill_controller();
    let result = run(env).await;
    env.start_controller()?;
    result
}

async fn run(env: &Env) -> Outcome {
    let seconds: u64 = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120)
        .max(30);
    let objects: u64 = std::env::var("SOAK_OBJECTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| Timestamp::now().as_nanosecond() as u64 | 1);
    let plane = env.control_plane();
    println!(
        "e2e: soak: {seconds}s, {objects} objects, seed {seed}{}",
        if plane.is_some() {
            ""
        } else {
            " (not the suite's own control plane: no apiserver restart, no etcd compaction)"
        }
    );
    let crd: TestCrd = env
        .create_crd(
            "soak",
            &[("v1alpha1", true, true), ("v1beta1", true, false), ("v1", false, false)],
        )
        .await?;

    // Two replicas behind a balancer, serving the webhook from certificate files.
    let dir: PathBuf = std::env::temp_dir().join(format!("{}-soak", env.run_id));
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).map_err(|e| e.to_string())?;
    let first_ca = write_certificates(&certs, 1)?;
    let webhook_ports = [free_port()?, free_port()?];
    let balancer = Balancer::start(webhook_ports.to_vec()).await?;
    let lease = format!("{}-soak", env.run_id);
    let mut replicas: Vec<Replica> = Vec::new();
    for (i, port) in webhook_ports.iter().enumerate() {
        let args = vec![
            "--leader-election=true".to_owned(),
            format!("--lease-name={lease}"),
            format!("--metrics-addr=127.0.0.1:{}", free_port()?),
            "--resync=30s".to_owned(),
            format!("--webhook-port={port}"),
            format!("--webhook-url=https://127.0.0.1:{}", balancer.port),
            format!("--webhook-secret={}-soak-webhook", env.run_id),
            format!("--webhook-cert-file={}", certs.join("tls.crt").display()),
            format!("--webhook-key-file={}", certs.join("tls.key").display()),
            format!("--webhook-ca-file={}", certs.join("ca.crt").display()),
        ];
        let mut replica = Replica::new(
            &format!("{}-soak-{i}", env.run_id),
            args,
            env.kubeconfig().map(Path::to_path_buf),
            std::env::temp_dir().join(format!("crd-lifecycle-{}-soak-{i}.log", env.run_id)),
        );
        replica.start()?;
        replicas.push(replica);
    }

    // The schedule, compressed: introduce and store v1, deprecate, unserve and remove v1alpha1.
    let start = Timestamp::now() + jiff::SignedDuration::from_secs(5);
    let at = |fraction: f64| {
        let offset = jiff::SignedDuration::from_secs_f64(seconds as f64 * fraction);
        (start + offset).round(jiff::Unit::Second).unwrap_or(start + offset)
    };
    let schedule = Schedule {
        introduce_v1: at(0.10),
        store_v1: at(0.20),
        deprecate_v1alpha1: at(0.30),
        unserve_v1alpha1: at(0.50),
        remove_v1alpha1: at(0.70),
    };
    let converter = crd_lifecycle::conversion::Converter::for_spec(
        &serde_json::from_value(conversion()).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("the soak's conversion is invalid: {e:?}"))?;
    let soak = Arc::new(Soak {
        client: env.clone_client(),
        group: crd.group.clone(),
        converter,
        schedule,
        truth: Mutex::new(BTreeMap::new()),
        counts: Counts::default(),
        problems: Mutex::new(Vec::new()),
        apiserver_down: AtomicBool::new(false),
        killed_at: Mutex::new(None),
        stop: AtomicBool::new(false),
        etcd: plane.map(crate::control_plane::ControlPlane::etcd),
        diagnosed_at: Mutex::new(None),
        excused_failures: Mutex::new(BTreeMap::new()),
    });

    // The objects, through the storage version, before the policy exists (until its webhook
    // converts, the CRD's conversion is None: a write through another version would be
    // stored as written, whatever its shape).
    let workers = 6u64;
    let mut owned: Vec<Vec<String>> = vec![Vec::new(); workers as usize];
    {
        let mut random = Random(seed);
        let creates = (0..objects).map(|i| {
            let worker = i % workers;
            let name = format!("s{worker}-{:04}", i / workers);
            owned[worker as usize].push(name.clone());
            let version = VERSIONS[0];
            let mut own = Random(random.next() | 1);
            let soak = soak.clone();
            async move { soak.create(&name, version, &mut own).await }
        });
        futures::stream::iter(creates.collect::<Vec<_>>())
            .buffer_unordered(16)
            .collect::<Vec<()>>()
            .await;
    }
    let policy_name = format!("{}-soak", env.run_id);
    let text = |t: Timestamp| t.to_string();
    let mut policy = json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
        "metadata": {"name": policy_name},
        "spec": {"crdName": crd.name,
                 "versions": [
                    {"name": "v1alpha1", "deprecate": {"at": text(schedule.deprecate_v1alpha1)},
                     "unserve": {"at": text(schedule.unserve_v1alpha1)}, "remove": {"at": text(schedule.remove_v1alpha1)}},
                    {"name": "v1", "introduce": {"at": text(schedule.introduce_v1)}, "store": {"at": text(schedule.store_v1)}},
                 ],
                 "migration": {"enabled": true, "concurrency": 8, "pageSize": 100}}});
    policy["spec"]["conversion"] = conversion();
    env.create_policy(policy).await?;
    wait_for(
        "the CRD converts through the webhook",
        Duration::from_secs(60),
        || async {
            let crd = env.crd(&crd.name).await?;
            Ok(crd.spec.conversion.is_some_and(|c| c.strategy == "Webhook"))
        },
    )
    .await?;

    // The CRD's versions and storedVersions as they change, for the record.
    let crd_log = {
        let (client, name, stop) = (env.clone_client(), crd.name.clone(), soak.clone());
        tokio::spawn(async move {
            let api: kube::Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
                kube::Api::all(client);
            let mut last = String::new();
            while !stop.stop.load(Ordering::Relaxed) {
                if let Ok(crd) = api.get(&name).await {
                    let flags: Vec<String> = crd
                        .spec
                        .versions
                        .iter()
                        .map(|v| format!("{}:{}", v.name, crate::flags::letters(v.served, v.storage, v.deprecated == Some(true))))
                        .collect();
                    let stored = crd.status.and_then(|s| s.stored_versions).unwrap_or_default();
                    let now = format!("{} stored {}", flags.join(" "), stored.join(","));
                    if now != last {
                        println!("e2e: soak: {} CRD {now}", Timestamp::now());
                        last = now;
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    // The clients.
    let mut tasks = Vec::new();
    for (worker, names) in owned.into_iter().enumerate() {
        tasks.push(tokio::spawn(soak.clone().worker(worker as u64, seed, names)));
    }
    for version in ["v1beta1", "v1"] {
        tasks.push(tokio::spawn(soak.clone().watcher(version)));
    }

    // Chaos, on the same compressed timeline.
    let began = Instant::now();
    let moment = |fraction: f64| Duration::from_secs_f64(seconds as f64 * fraction + 5.0);
    let mut restarts: BTreeMap<&str, u32> = BTreeMap::new();
    let mut second_ca = None;
    let leader_index = |replicas: &[Replica], holder: Option<String>| {
        holder
            .and_then(|h| replicas.iter().position(|r| r.identity == h))
            .unwrap_or(0)
    };
    let events: [(f64, &str); 6] = [
        (0.15, "kill the leader"),
        (0.28, "rotate the webhook CA"),
        (0.40, "stop the leader"),
        (0.45, "restart the apiserver"),
        (0.62, "compact etcd"),
        (0.75, "restart the other replica"),
    ];
    for (fraction, what) in events {
        tokio::time::sleep(moment(fraction).saturating_sub(began.elapsed())).await;
        let holder = lease_holder(env, &lease).await;
        let leader = leader_index(&replicas, holder);
        println!("e2e: soak: {} ({:>5.1}s) {what}", Timestamp::now(), began.elapsed().as_secs_f64());
        match what {
            "kill the leader" => {
                *lock(&soak.killed_at) = Some(Instant::now());
                replicas[leader].kill();
                tokio::time::sleep(Duration::from_secs(1)).await;
                replicas[leader].start()?;
                *restarts.entry("controller").or_default() += 1;
            }
            "stop the leader" | "restart the other replica" => {
                let index = if what == "stop the leader" { leader } else { 1 - leader };
                let replica = &mut replicas[index];
                let status = tokio::task::block_in_place(|| replica.terminate(Duration::from_secs(30)));
                ensure!(status.is_some(), "replica {} did not stop within 30 s of SIGTERM", replica.identity);
                replica.start()?;
                *restarts
                    .entry(if what == "stop the leader" { "controller" } else { "webhook" })
                    .or_default() += 1;
            }
            "rotate the webhook CA" => {
                second_ca = Some(write_certificates(&certs, 2)?);
                *restarts.entry("CA rotation").or_default() += 1;
            }
            "restart the apiserver" => {
                if let Some(plane) = plane {
                    soak.apiserver_down.store(true, Ordering::Relaxed);
                    plane.restart_apiserver().await?;
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    soak.apiserver_down.store(false, Ordering::Relaxed);
                    *restarts.entry("apiserver").or_default() += 1;
                }
            }
            "compact etcd" => {
                if let Some(plane) = plane {
                    plane.etcd().compact().await?;
                    *restarts.entry("etcd compaction").or_default() += 1;
                }
            }
            _ => {}
        }
    }
    tokio::time::sleep(moment(1.0).saturating_sub(began.elapsed())).await;
    soak.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    let _ = crd_log.await;

    // The policy reaches its end: v1 stored, every object migrated, v1alpha1 removed.
    wait_for(
        "storedVersions is [v1] and v1alpha1 is removed",
        Duration::from_secs(180),
        || async {
            let crd_now = env.crd(&crd.name).await?;
            let versions: Vec<&str> = crd_now.spec.versions.iter().map(|v| v.name.as_str()).collect();
            let stored = crd_now
                .status
                .as_ref()
                .and_then(|s| s.stored_versions.clone())
                .unwrap_or_default();
            Ok(stored == ["v1"] && !versions.contains(&"v1alpha1"))
        },
    )
    .await?;
    let migration = env.policy(&policy_name).await?["status"]["migration"].clone();
    ensure!(
        migration["phase"] == "Succeeded" && migration["storageVersion"] == "v1",
        "the migration did not finish: {migration}"
    );

    // Nothing lost: every object that should exist reads through every served version, with
    // the right content.
    let expected: BTreeSet<String> = lock(&soak.truth)
        .iter()
        .filter(|(_, t)| !t.deleted && !t.delete_unsure && t.current > 0)
        .map(|(name, _)| name.clone())
        .collect();
    let maybe: BTreeSet<String> = lock(&soak.truth)
        .iter()
        .filter(|(_, t)| t.delete_unsure || (t.current == 0 && !t.deleted))
        .map(|(name, _)| name.clone())
        .collect();
    let mut lost = 0usize;
    for version in ["v1beta1", "v1"] {
        let items = env.list_via(&crd, version).await?;
        let listed: BTreeSet<String> = items
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        for item in &items {
            soak.check(item, version, "final list");
        }
        for name in expected.difference(&listed) {
            lost += 1;
            soak.problem(format!("lost: {name} is missing from the final list through {version}"));
        }
        for name in listed.difference(&expected).filter(|n| !maybe.contains(*n)) {
            soak.problem(format!("wrong: {name} is listed through {version} but was deleted"));
        }
    }
    // Every object is stored in the storage version (checked in etcd itself).
    if let Some(plane) = plane {
        for name in &expected {
            let key = format!("/registry/{}/widgets/{name}", crd.group);
            match plane.etcd().get(&key).await? {
                Some(stored) if stored["apiVersion"] == format!("{}/v1", crd.group).as_str() => {}
                Some(stored) => soak.problem(format!("{name} is stored in etcd as {}", stored["apiVersion"])),
                None => {
                    lost += 1;
                    soak.problem(format!("lost: {name} is not in etcd"));
                }
            }
        }
    }
    // The rotation reached the CRD.
    if let Some(ca) = &second_ca {
        let bundle = env
            .crd(&crd.name)
            .await?
            .spec
            .conversion
            .and_then(|c| c.webhook)
            .and_then(|w| w.client_config)
            .and_then(|c| c.ca_bundle)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_default();
        ensure!(
            bundle.contains(ca.trim()),
            "the CRD's caBundle does not hold the rotated CA after the run"
        );
        let _ = &first_ca;
    }

    let problems = lock(&soak.problems).clone();
    let wrong = problems.iter().filter(|p| p.starts_with("wrong")).count();
    let refused = problems.iter().filter(|p| p.starts_with("refused")).count();
    let counts = &soak.counts;
    let restarts_text = restarts
        .iter()
        .map(|(what, n)| format!("{what} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "soak: {seconds}s, {} objects at the end: reads {}, writes {}, conversions checked {}, watch events {}, restarts {} ({restarts_text}), wrong {wrong}, lost {lost}, refused through served versions {refused}, refused through unserved versions {}, conflicts {}, transient failures {}, continued pages from before the migration refused {}",
        expected.len(),
        counts.reads.load(Ordering::Relaxed),
        counts.writes.load(Ordering::Relaxed),
        counts.conversions_checked.load(Ordering::Relaxed),
        counts.watch_events.load(Ordering::Relaxed),
        restarts.values().sum::<u32>(),
        counts.refused_unserved.load(Ordering::Relaxed),
        counts.conflicts.load(Ordering::Relaxed),
        counts.transient.load(Ordering::Relaxed),
        counts.stale_snapshot_pages.load(Ordering::Relaxed),
    );
    for (kind, (count, first)) in lock(&soak.excused_failures).iter() {
        println!("e2e: soak: excused (apiserver restarting or replica killed): {count} x {kind}... (first at {first})");
    }
    for replica in &mut replicas {
        tokio::task::block_in_place(|| replica.terminate(Duration::from_secs(30)));
    }
    drop(balancer);
    let _ = std::fs::remove_dir_all(&dir);
    if !problems.is_empty() {
        // Up to three examples of each kind of problem.
        let mut by_kind: BTreeMap<String, Vec<&String>> = BTreeMap::new();
        for problem in &problems {
            let kind: String = problem.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
            by_kind.entry(kind).or_default().push(problem);
        }
        let examples: Vec<String> = by_kind
            .iter()
            .map(|(kind, all)| {
                let first: Vec<&str> = all.iter().take(3).map(|p| p.as_str()).collect();
                format!("{} x {kind}: {}", all.len(), first.join(" | "))
            })
            .collect();
        return Err(format!("{} problems; {}", problems.len(), examples.join(" || ")));
    }
    Ok(())
}

async fn lease_holder(env: &Env, lease: &str) -> Option<String> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(env.client.clone(), "default");
    leases.get_opt(lease).await.ok()??.spec?.holder_identity
}
