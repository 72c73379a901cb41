//! The soak: proves that nothing is lost or converted wrong while everything that can restart
//! does. A CRD with three versions converts through the declarative webhook, served by two
//! controller replicas (leader election) behind a load balancer; hundreds of objects; clients
//! create, update, read (GET, paged LIST, watch) and delete through every version, checking
//! every object they read against the content expected in that version. Meanwhile the policy
//! walks introduce → store → deprecate → unserve → remove on a timeline compressed to
//! `SOAK_SECONDS` (default 120), and the test SIGKILLs and SIGTERMs the leader, restarts the
//! other replica (a webhook replica), rotates the webhook's CA, restarts the apiserver and
//! compacts etcd (the last two only on a control plane the suite started). It ends with every
//! migration finished, `storedVersions` trimmed, the old version removed, every object stored
//! in the new version in etcd, and one summary line; it fails on any lost object, any wrong
//! read, and any request refused through a version that was served at that moment.
//!
//! The expected content is not computed by the code under test: `Content` models what each
//! version shows of an object (the policy's rename, added default, removed field, nested move
//! and type change, written out by hand), and a write changes only what its version holds
//! (the rest survives in the conversion's annotation, which clients send back).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt as _, StreamExt};
use jiff::Timestamp;
use kube::Client;
use serde_json::{Value, json};

use crate::balancer::{Backend, Balancer, OnRefused, Readyz};
use crate::control_plane::free_port;
use crate::ensure;
use crate::env::{Env, Outcome, TestCrd, lock, wait_for};
use crate::replicas::Replica;

const VERSIONS: [&str; 3] = ["v1alpha1", "v1beta1", "v1"];

/// How late after its instant a transition may still be landing (the controller's 2 s and a
/// margin for a busy reconcile).
const LANDING: Duration = Duration::from_secs(5);

/// What an object holds, whatever version shows it: v1alpha1 `{size, legacyMode, port:
/// string}`, v1beta1 `{replicas, color (default blue), port: string}`, v1 `{scale: {replicas},
/// color, port: integer}`.
#[derive(Clone, Debug, PartialEq)]
struct Content {
    replicas: u64,
    /// Set only by a write through v1beta1 or v1 (v1alpha1 shows the default).
    color: Option<String>,
    /// Set only by a write through v1alpha1 (the others do not show it).
    legacy: Option<bool>,
    /// As written: zero-padded text survives the round trip through the integer of v1.
    port: String,
    /// The version it was written through: read back through it, it is exactly as written;
    /// through a string version after a write through the integer one, the conversion may
    /// give back an earlier text of the same number (`"08012"` for 8012, from its
    /// annotation), so there the port is compared as a number.
    written_through: String,
}

impl Content {
    /// After a write of `spec` through `version` over `previous` (`None`: a create). Fields
    /// the version does not hold keep their values.
    fn written(previous: Option<&Content>, version: &str, spec: &Value) -> Content {
        let mut content = previous.cloned().unwrap_or(Content {
            replicas: 0,
            color: None,
            legacy: None,
            port: String::new(),
            written_through: String::new(),
        });
        content.written_through = version.to_owned();
        let text = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        match version {
            "v1alpha1" => {
                content.replicas = spec["size"].as_u64().unwrap_or(0);
                content.legacy = spec["legacyMode"].as_bool();
                content.port = text(&spec["port"]);
            }
            "v1beta1" => {
                content.replicas = spec["replicas"].as_u64().unwrap_or(0);
                content.color = spec["color"].as_str().map(str::to_owned);
                content.port = text(&spec["port"]);
            }
            _ => {
                content.replicas = spec["scale"]["replicas"].as_u64().unwrap_or(0);
                content.color = spec["color"].as_str().map(str::to_owned);
                content.port = text(&spec["port"]);
            }
        }
        content
    }

    /// The spec `version` shows.
    fn spec(&self, version: &str) -> Value {
        let color = self.color.clone().unwrap_or_else(|| "blue".to_owned());
        match version {
            "v1alpha1" => {
                let mut spec = json!({"size": self.replicas, "port": self.port});
                if let Some(legacy) = self.legacy {
                    spec["legacyMode"] = legacy.into();
                }
                spec
            }
            "v1beta1" => json!({"replicas": self.replicas, "color": color, "port": self.port}),
            _ => json!({"scale": {"replicas": self.replicas}, "color": color,
                        "port": self.port.parse::<u64>().unwrap_or(0)}),
        }
    }
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
    /// Whether a 404 (the version not served) for a request sent at `sent` and answered at
    /// `answered` through `version` is what the schedule says: before a version is introduced
    /// (or while its introduction is landing), and from its unserve on.
    fn may_be_unserved(&self, version: &str, sent: Timestamp, answered: Timestamp) -> bool {
        let landing = jiff::SignedDuration::try_from(LANDING).unwrap_or_default();
        match version {
            "v1" => sent < self.introduce_v1 + landing,
            "v1alpha1" => answered >= self.unserve_v1alpha1,
            _ => false,
        }
    }
}

/// What the test knows of one object.
#[derive(Default)]
struct Truth {
    /// generation → what it holds.
    generations: BTreeMap<i64, Content>,
    /// The generation of the last write known to have landed.
    current: i64,
    /// A write whose answer was lost (it may have landed): a later generation may appear.
    unsure: bool,
    deleted: bool,
    /// A delete whose answer was lost: the object may still be there.
    delete_unsure: bool,
}

/// The truth about one object when a request about it was sent.
#[derive(Clone, Copy)]
struct AtSend {
    known: bool,
    current: i64,
    gone: bool,
    maybe_gone: bool,
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
    expired_lists: AtomicU64,
    /// Continued list pages refused because their snapshot predates the migration.
    stale_snapshot_pages: AtomicU64,
}

/// How long a replica may take to exit after SIGTERM: the webhook's drain (10 s), then up
/// to 15 s for requests in flight and 100 s (`--webhook-idle-grace`) for the apiserver to
/// close the HTTP/1.1 connections it keeps idle (it does after 90 s), and a margin. It
/// exits as soon as they are closed.
const EXIT_AFTER_SIGTERM: Duration = Duration::from_secs(135);

/// Periods in which requests may fail without a fault of the operator's: the apiserver
/// restarting, or a replica killed without a drain (its in-flight conversions are lost, as a
/// pod's are). Only failures of the transport kind are excused, and only for requests sent or
/// answered inside one.
#[derive(Default)]
struct Excuses {
    windows: Mutex<Vec<(Instant, Option<Instant>, &'static str)>>,
}

impl Excuses {
    fn open(&self, why: &'static str) -> usize {
        let mut windows = lock(&self.windows);
        windows.push((Instant::now(), None, why));
        windows.len() - 1
    }

    fn close(&self, index: usize, after: Duration) {
        if let Some(window) = lock(&self.windows).get_mut(index) {
            window.1 = Some(Instant::now() + after);
        }
    }

    fn covers(&self, sent: Instant, answered: Instant) -> bool {
        lock(&self.windows).iter().any(|(from, to, _)| {
            let to = to.unwrap_or(answered);
            (sent >= *from && sent <= to) || (answered >= *from && answered <= to)
        })
    }
}

/// Whether a failure is of the kind an apiserver restart or a killed replica causes: no
/// connection, a reset, a timeout, the apiserver not ready yet, or the webhook's connection
/// lost (the apiserver's 500 names the transport error).
fn transport_failure(message: &str) -> bool {
    [
        "client error (Connect)",
        "connection refused",
        "connection reset",
        "broken pipe",
        "EOF",
        "no answer within",
        "timed out",
        "503",
        "429",
        "CANCEL",
        "http2: client connection lost",
        "ServiceError",
        "HyperError",
    ]
    .iter()
    .any(|kind| message.contains(kind))
}

/// Everything the clients share.
struct Soak {
    client: Client,
    group: String,
    schedule: Schedule,
    truth: Mutex<BTreeMap<String, Truth>>,
    counts: Counts,
    /// Problems found: wrong reads, lost objects, refused requests (capped when reported).
    problems: Mutex<Vec<String>>,
    excuses: Excuses,
    /// The CRD's resourceVersion (an etcd revision) whose state first had `storedVersions`
    /// `[v1]`: the migration's trim, as the CRD's watch delivered it (or, after a gap in that
    /// watch, the first state read after it).
    trimmed_at_revision: Mutex<Option<u64>>,
    stop: AtomicBool,
}

/// How a request ended, as the soak classifies it.
enum Answer {
    Ok(Value),
    /// A plain-text 404: the version is not served (apiserver-samples/15).
    Unserved,
    /// A Status 404: the object does not exist.
    NotFound,
    Conflict,
    Failed(String),
}

/// A request's answer, with when it was sent and answered.
struct Exchange {
    answer: Answer,
    sent: Instant,
    sent_at: Timestamp,
    answered: Instant,
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

    fn at_send(&self, name: &str) -> AtSend {
        let truth = lock(&self.truth);
        match truth.get(name) {
            Some(t) => AtSend {
                known: true,
                current: t.current,
                gone: t.deleted && !t.delete_unsure,
                maybe_gone: t.deleted || t.delete_unsure,
            },
            None => AtSend {
                known: false,
                current: 0,
                gone: false,
                maybe_gone: false,
            },
        }
    }

    async fn send(&self, method: http::Method, path: &str, body: Option<&Value>) -> Exchange {
        let (sent, sent_at) = (Instant::now(), Timestamp::now());
        let answer = self.exchange(method, path, body).await;
        Exchange {
            answer,
            sent,
            sent_at,
            answered: Instant::now(),
        }
    }

    async fn exchange(&self, method: http::Method, path: &str, body: Option<&Value>) -> Answer {
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(
                body.map(|b| serde_json::to_vec(b).unwrap_or_default())
                    .unwrap_or_default(),
            );
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
                value.map_or_else(
                    || String::from_utf8_lossy(&bytes).into_owned(),
                    |v| v["message"].to_string()
                )
            )),
        }
    }

    /// Checks an object read through `version` against what was written, given what was known
    /// when the request was sent (`at_send`: `None` for watch events and final lists, which
    /// may lag or race).
    fn check(&self, object: &Value, version: &str, how: &str, at_send: Option<AtSend>) {
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
        let content = {
            let truth = lock(&self.truth);
            let Some(known) = truth.get(&name) else {
                drop(truth);
                self.problem(format!(
                    "wrong: {how} through {version} returned {name}, which was never written"
                ));
                return;
            };
            known.generations.get(&generation).cloned()
        };
        let Some(content) = content else {
            self.problem(format!(
                "wrong: {how} {name} through {version} has generation {generation}, never written"
            ));
            return;
        };
        // A read sees at least every write answered before it was sent.
        if let Some(at_send) = at_send
            && generation < at_send.current
        {
            self.problem(format!(
                "lost: {how} {name} through {version} read generation {generation}, after generation {} had landed",
                at_send.current
            ));
        }
        if version != "v1" {
            self.counts.conversions_checked.fetch_add(1, Ordering::Relaxed);
        }
        let expected = content.spec(version);
        let same = |a: &Value, b: &Value| {
            if version == content.written_through || version == "v1" {
                return a == b;
            }
            let number = |v: &Value| v["port"].as_str().and_then(|p| p.parse::<u64>().ok());
            let mut a = a.clone();
            let mut b = b.clone();
            let (pa, pb) = (number(&a), number(&b));
            a["port"] = Value::Null;
            b["port"] = Value::Null;
            a == b && pa.is_some() && pa == pb
        };
        if !same(&expected, &object["spec"]) {
            self.problem(format!(
                "wrong: {how} {name} (generation {generation}) through {version}: spec {} expected {expected}",
                object["spec"]
            ));
        }
    }

    /// A spec in `version`'s shape, with a port other than `avoid`'s.
    fn spec(version: &str, replicas: u64, avoid: Option<&Content>, random: &mut Random) -> Value {
        let previous = avoid.and_then(|c| c.port.parse::<u64>().ok());
        let mut port = 8000 + random.below(100);
        if Some(port) == previous {
            port = 8000 + (port - 8000 + 1) % 100;
        }
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

    /// A 404 for an unserved version: expected if the schedule says it may be unserved,
    /// else a refusal through a served version.
    fn unserved(&self, version: &str, what: &str, exchange: &Exchange) {
        if self
            .schedule
            .may_be_unserved(version, exchange.sent_at, Timestamp::now())
        {
            self.counts.refused_unserved.fetch_add(1, Ordering::Relaxed);
        } else {
            self.problem(format!(
                "refused: {what} through {version} answered 404 while {version} is served"
            ));
        }
    }

    async fn failed(&self, version: &str, what: &str, message: &str, exchange: &Exchange) {
        if transport_failure(message) && self.excuses.covers(exchange.sent, exchange.answered) {
            self.counts.transient.fetch_add(1, Ordering::Relaxed);
        } else {
            self.problem(format!("refused: {what} through {version}: {message}"));
        }
        // A client backs off after a failure instead of hammering a restarting apiserver.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    async fn create(&self, name: &str, version: &str, random: &mut Random) {
        let spec = Self::spec(version, 1, None, random);
        let body = json!({"apiVersion": format!("{}/{version}", self.group), "kind": "Widget",
                          "metadata": {"name": name}, "spec": spec});
        let content = Content::written(None, version, &spec);
        lock(&self.truth)
            .entry(name.to_owned())
            .or_default()
            .generations
            .insert(1, content);
        let exchange = self
            .send(http::Method::POST, &self.path(version, None), Some(&body))
            .await;
        match &exchange.answer {
            Answer::Ok(created) => {
                self.counts.writes.fetch_add(1, Ordering::Relaxed);
                let at_send = self.landed(name, 1);
                self.check(created, version, "create", Some(at_send));
            }
            Answer::Unserved => self.forget(name, 1, || self.unserved(version, "create", &exchange)),
            Answer::Conflict => self.problem(format!("create {name}: already exists")),
            Answer::NotFound => self.problem(format!("refused: create {name} through {version}: 404 Status")),
            // The create may have landed: a later read tells (generation 1 is expected).
            Answer::Failed(message) => {
                self.unsure(name);
                self.failed(version, &format!("create {name}"), message, &exchange)
                    .await;
            }
        }
    }

    /// Records a write as landed; returns the truth as it was when sent (for the check of its
    /// answer).
    fn landed(&self, name: &str, generation: i64) -> AtSend {
        let mut truth = lock(&self.truth);
        let entry = truth.entry(name.to_owned()).or_default();
        let before = AtSend {
            known: true,
            current: entry.current,
            gone: false,
            maybe_gone: false,
        };
        entry.current = entry.current.max(generation);
        before
    }

    fn unsure(&self, name: &str) {
        if let Some(known) = lock(&self.truth).get_mut(name) {
            known.unsure = true;
        }
    }

    /// Forgets a write that certainly did not land.
    fn forget(&self, name: &str, generation: i64, then: impl FnOnce()) {
        if let Some(known) = lock(&self.truth).get_mut(name)
            && known.current < generation
            && !known.unsure
        {
            known.generations.remove(&generation);
        }
        then();
    }

    async fn update(&self, name: &str, version: &str, random: &mut Random) {
        let at_send = self.at_send(name);
        let exchange = self
            .send(http::Method::GET, &self.path(version, Some(name)), None)
            .await;
        let current = match &exchange.answer {
            Answer::Ok(object) => object.clone(),
            Answer::Unserved => return self.unserved(version, &format!("get {name} (to update)"), &exchange),
            Answer::NotFound => return self.not_found(name, version, at_send),
            Answer::Conflict => return,
            Answer::Failed(message) => {
                return self
                    .failed(version, &format!("get {name}"), message, &exchange)
                    .await;
            }
        };
        self.counts.reads.fetch_add(1, Ordering::Relaxed);
        self.check(&current, version, "get", Some(at_send));
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(0);
        let previous = lock(&self.truth)
            .get(name)
            .and_then(|t| t.generations.get(&generation).cloned());
        let Some(previous) = previous else { return };
        let mut body = current.clone();
        let spec = Self::spec(
            version,
            u64::try_from(generation).unwrap_or(0) + 1,
            Some(&previous),
            random,
        );
        body["spec"] = spec.clone();
        let next = generation + 1;
        lock(&self.truth)
            .entry(name.to_owned())
            .or_default()
            .generations
            .insert(next, Content::written(Some(&previous), version, &spec));
        let exchange = self
            .send(http::Method::PUT, &self.path(version, Some(name)), Some(&body))
            .await;
        match &exchange.answer {
            Answer::Ok(updated) => {
                self.counts.writes.fetch_add(1, Ordering::Relaxed);
                let at_send = self.landed(name, next);
                self.check(updated, version, "update", Some(at_send));
            }
            Answer::Conflict => self.forget(name, next, || {
                self.counts.conflicts.fetch_add(1, Ordering::Relaxed);
            }),
            Answer::Unserved => self.forget(name, next, || {
                self.unserved(version, &format!("update {name}"), &exchange)
            }),
            Answer::NotFound => self.not_found(name, version, at_send),
            Answer::Failed(message) => {
                self.unsure(name);
                self.failed(version, &format!("update {name}"), message, &exchange)
                    .await;
            }
        }
    }

    /// A NotFound for an object that existed when the request was sent (and was not being
    /// deleted) is a lost object.
    fn not_found(&self, name: &str, version: &str, at_send: AtSend) {
        let existed = at_send.known && at_send.current > 0 && !at_send.maybe_gone;
        if existed {
            self.problem(format!("lost: {name} answered NotFound through {version}"));
        }
    }

    async fn get(&self, name: &str, version: &str) {
        let at_send = self.at_send(name);
        let exchange = self
            .send(http::Method::GET, &self.path(version, Some(name)), None)
            .await;
        match &exchange.answer {
            Answer::Ok(object) => {
                self.counts.reads.fetch_add(1, Ordering::Relaxed);
                if at_send.gone {
                    self.problem(format!(
                        "wrong: {name} reads through {version} after it was deleted"
                    ));
                } else {
                    self.check(object, version, "get", Some(at_send));
                }
            }
            Answer::Unserved => self.unserved(version, &format!("get {name}"), &exchange),
            Answer::NotFound => self.not_found(name, version, at_send),
            Answer::Conflict => {}
            Answer::Failed(message) => {
                self.failed(version, &format!("get {name}"), message, &exchange)
                    .await
            }
        }
    }

    async fn list(&self, version: &str) {
        let mut token = String::new();
        // The revision the first page was read at: every continued page reads etcd there.
        let mut snapshot: Option<u64> = None;
        loop {
            let mut path = format!("{}?limit=50", self.path(version, None));
            if !token.is_empty() {
                path.push_str(&format!("&continue={token}"));
            }
            let exchange = self.send(http::Method::GET, &path, None).await;
            match &exchange.answer {
                Answer::Ok(list) => {
                    if snapshot.is_none() {
                        snapshot = list["metadata"]["resourceVersion"]
                            .as_str()
                            .and_then(|rv| rv.parse().ok());
                    }
                    for item in list["items"].as_array().into_iter().flatten() {
                        self.counts.reads.fetch_add(1, Ordering::Relaxed);
                        self.check(item, version, "list", None);
                    }
                    token = list["metadata"]["continue"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    if token.is_empty() {
                        return;
                    }
                }
                Answer::Unserved => return self.unserved(version, "list", &exchange),
                // An expired continue token (410, after a compaction) ends this listing.
                Answer::Failed(message) if message.starts_with("410") => {
                    self.counts.expired_lists.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // A continued list reads etcd at the revision of its first page. Read before
                // the migration rewrote every object (the trim) and continued after the old
                // version was removed, it meets objects as they were then, in a version the
                // CRD no longer has: the apiserver answers 500 until etcd compacts that
                // revision (tests/fixtures/continue-after-version-removal.txt). Compared as
                // revisions, not as times: a page sent before the trim may arrive after it.
                Answer::Failed(message)
                    if message.contains("from an invalid group/version")
                        && snapshot.is_some_and(|first| {
                            lock(&self.trimmed_at_revision).is_none_or(|trimmed| first < trimmed)
                        }) =>
                {
                    self.counts.stale_snapshot_pages.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Answer::Failed(message) => return self.failed(version, "list", message, &exchange).await,
                Answer::NotFound => {
                    return self.problem(format!("refused: list through {version}: 404 Status"));
                }
                Answer::Conflict => return,
            }
        }
    }

    async fn delete(&self, name: &str, version: &str) {
        let at_send = self.at_send(name);
        if let Some(known) = lock(&self.truth).get_mut(name) {
            known.delete_unsure = true;
        }
        let exchange = self
            .send(http::Method::DELETE, &self.path(version, Some(name)), None)
            .await;
        let deleted = |soak: &Soak| {
            if let Some(known) = lock(&soak.truth).get_mut(name) {
                known.deleted = true;
                known.delete_unsure = false;
            }
        };
        match &exchange.answer {
            Answer::Ok(_) => {
                self.counts.writes.fetch_add(1, Ordering::Relaxed);
                deleted(self);
            }
            Answer::NotFound => {
                self.not_found(name, version, at_send);
                deleted(self);
            }
            Answer::Unserved => {
                if let Some(known) = lock(&self.truth).get_mut(name) {
                    known.delete_unsure = false;
                }
                self.unserved(version, &format!("delete {name}"), &exchange);
            }
            Answer::Conflict => {}
            Answer::Failed(message) => {
                self.failed(version, &format!("delete {name}"), message, &exchange)
                    .await
            }
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
    /// object an event carries; errors count like refused reads.
    async fn watcher(self: Arc<Self>, version: &'static str) {
        let resource = kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(&self.group, version, "Widget"),
            "widgets",
        );
        let api: kube::Api<kube::core::DynamicObject> = kube::Api::all_with(self.client.clone(), &resource);
        // Its list in one page: a paged list continued after the old version's removal meets
        // objects as they were at its first page, which `list` excuses by revision (the
        // watcher does not tell its list's revision). Paging is `list`'s to prove.
        let config = kube::runtime::watcher::Config::default().page_size(10_000);
        let mut stream = kube::runtime::watcher(api, config).boxed();
        while !self.stop.load(Ordering::Relaxed) {
            let waited = Instant::now();
            let next = tokio::time::timeout(Duration::from_secs(1), stream.next()).await;
            let event = match next {
                Ok(Some(Ok(event))) => event,
                Ok(Some(Err(error))) => {
                    let message = error.to_string();
                    let exchange = Exchange {
                        answer: Answer::Failed(message.clone()),
                        sent: waited,
                        sent_at: Timestamp::now(),
                        answered: Instant::now(),
                    };
                    // Expected: an expired resourceVersion after a compaction (410: the
                    // watcher relists), the version not served yet (404). Expiry first: its
                    // message carries resourceVersions, which may contain "404".
                    if message.contains("Expired") || message.contains("too old") {
                        self.counts.expired_lists.fetch_add(1, Ordering::Relaxed);
                    } else if message.contains("404") {
                        self.unserved(version, &format!("watch ({message})"), &exchange);
                    } else {
                        self.failed(version, "watch", &message, &exchange).await;
                    }
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
                let Ok(value) = serde_json::to_value(&object) else {
                    continue;
                };
                self.counts.watch_events.fetch_add(1, Ordering::Relaxed);
                self.check(&value, version, "watch", None);
            }
        }
    }
}

/// Writes the webhook's certificate files the way the kubelet updates a Secret volume: into a
/// new directory, then one atomic swap of the `..data` link that `tls.crt`, `tls.key` and
/// `ca.crt` point through, so that no reader sees a new certificate with an old CA.
fn write_certificates(dir: &Path, host: &str, generation: u32) -> Result<String, String> {
    let bundle = crd_lifecycle::webhook::certs::new_bundle(&[host.to_owned()], Timestamp::now())
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
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(file), &link).map_err(|e| e.to_string())?;
        }
    }
    let staged = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&staged);
    std::os::unix::fs::symlink(format!("..{generation}"), &staged).map_err(|e| e.to_string())?;
    std::fs::rename(&staged, dir.join("..data")).map_err(|e| e.to_string())?;
    Ok(bundle.ca_pem)
}

/// Whether the webhook on `port` serves a certificate `ca_pem` signed (a TLS handshake that
/// trusts only that CA).
async fn serves_certificate_of(host: &str, port: u16, ca_pem: &str) -> bool {
    use rustls::pki_types::pem::PemObject as _;
    let Ok(ca) = rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()) else {
        return false;
    };
    let mut roots = rustls::RootCertStore::empty();
    if roots.add(ca).is_err() {
        return false;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let Ok(builder) =
        rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions()
    else {
        return false;
    };
    let config = builder.with_root_certificates(roots).with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let (Ok(tcp), Ok(name)) = (
        tokio::net::TcpStream::connect((host, port)).await,
        rustls::pki_types::ServerName::try_from(host.to_owned()),
    ) else {
        return false;
    };
    connector.connect(name, tcp).await.is_ok()
}

/// Conversions a replica's webhook answered successfully (its `/metrics`).
async fn reviews_served(metrics_port: u16) -> u64 {
    let scrape = crate::control_plane::plain_http(metrics_port, "GET", "/metrics", None);
    let Ok(Ok((_, text))) = tokio::time::timeout(Duration::from_secs(5), scrape).await else {
        return 0;
    };
    text.lines()
        .filter(|l| {
            l.starts_with("crd_lifecycle_conversion_reviews_total") && l.contains("result=\"success\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Stops the clients however the soak ends (an early error included).
struct Clients {
    soak: Arc<Soak>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Clients {
    fn drop(&mut self) {
        self.soak.stop.store(true, Ordering::Relaxed);
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The two replicas, restarted when they exit by themselves (as the kubelet restarts a
/// container); each exit that the soak did not cause is recorded.
struct Replicas {
    replicas: Vec<Replica>,
    metrics_ports: Vec<u16>,
    /// (identity, how it exited, whether its log says why by design: leadership lost, or the
    /// apiserver unreachable at start).
    exits: Vec<(String, String, bool)>,
    /// Conversions each replica (slot) answered over the whole soak, across its restarts,
    /// and the count its current process last reported.
    served: Vec<(u64, u64)>,
    scraped_at: Option<Instant>,
}

impl Replicas {
    /// Restarts the replicas that exited by themselves.
    fn supervise(&mut self) -> Result<(), String> {
        for replica in &mut self.replicas {
            if let Some(status) = replica.exited() {
                // Designed exits: leadership lost (the apiserver unreachable for the renew
                // deadline), or the apiserver unreachable at start (the kubelet restarts it).
                let log = replica.log_of_this_start();
                let designed = log.contains("lost leadership") || log.contains("cannot reach the apiserver");
                self.exits
                    .push((replica.identity.clone(), status.to_string(), designed));
                replica.start()?;
            }
        }
        Ok(())
    }

    /// Adds what each replica's process answered since the last scrape (its counter starts
    /// again at 0 with each process).
    async fn scrape(&mut self) {
        if self
            .scraped_at
            .is_some_and(|at| at.elapsed() < Duration::from_secs(2))
        {
            return;
        }
        self.scraped_at = Some(Instant::now());
        self.served.resize(self.metrics_ports.len(), (0, 0));
        for (slot, port) in self.metrics_ports.iter().enumerate() {
            let now = reviews_served(*port).await;
            let (total, last) = &mut self.served[slot];
            *total += if now >= *last { now - *last } else { now };
            *last = now;
        }
    }

    /// Supervises until `until`.
    async fn supervise_until(&mut self, until: Instant) -> Result<(), String> {
        while Instant::now() < until {
            self.supervise()?;
            self.scrape().await;
            tokio::time::sleep(
                Duration::from_millis(250).min(until.saturating_duration_since(Instant::now())),
            )
            .await;
        }
        Ok(())
    }
}

pub async fn soak(env: &Env) -> Outcome {
    if env.in_cluster {
        return crate::env::skip("soak", "in-cluster mode (the deployed operator would act too)");
    }
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
    // Where the apiserver reaches the webhook (the balancer); 127.0.0.1 for an apiserver on
    // this machine, as the suite's own.
    let host = std::env::var("E2E_WEBHOOK_HOST").unwrap_or_else(|_| "127.0.0.1".to_owned());
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
            &[
                ("v1alpha1", true, true),
                ("v1beta1", true, false),
                ("v1", false, false),
            ],
        )
        .await?;

    // Two replicas behind a balancer, serving the webhook from certificate files.
    let dir: PathBuf = std::env::temp_dir().join(format!("{}-soak", env.run_id));
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).map_err(|e| e.to_string())?;
    write_certificates(&certs, &host, 1)?;
    let webhook_ports = [free_port()?, free_port()?];
    let health_ports = [free_port()?, free_port()?];
    let balancer = Balancer::start(
        &host,
        webhook_ports
            .iter()
            .zip(health_ports)
            .map(|(webhook, health)| Backend {
                webhook: *webhook,
                readyz: Readyz::Http(health),
            })
            .collect(),
        OnRefused::NextReady,
        None,
    )
    .await?;
    let lease = format!("{}-soak", env.run_id);
    let mut replicas = Replicas {
        replicas: Vec::new(),
        metrics_ports: Vec::new(),
        exits: Vec::new(),
        served: Vec::new(),
        scraped_at: None,
    };
    let replica_args = |port: u16, metrics: u16| {
        vec![
            "--leader-election=true".to_owned(),
            format!("--lease-name={lease}"),
            format!("--metrics-addr=127.0.0.1:{metrics}"),
            "--resync=30s".to_owned(),
            format!("--webhook-port={port}"),
            // Short, so that the apiserver's connections (HTTP/2 to this loopback URL from
            // 1.30 on, one at a time; HTTP/1.1, a pool, before) move between the replicas
            // within the soak, as the default 5 minutes does over a day.
            "--webhook-max-connection-age=20s".to_owned(),
            format!("--webhook-url=https://{host}:{}", balancer.port),
            format!("--webhook-secret={}-soak-webhook", env.run_id),
            format!("--webhook-cert-file={}", certs.join("tls.crt").display()),
            format!("--webhook-key-file={}", certs.join("tls.key").display()),
            format!("--webhook-ca-file={}", certs.join("ca.crt").display()),
        ]
    };
    for (i, (port, metrics)) in webhook_ports.iter().zip(health_ports).enumerate() {
        let mut replica = Replica::new(
            &format!("{}-soak-{i}", env.run_id),
            replica_args(*port, metrics),
            env.kubeconfig().map(Path::to_path_buf),
            dir.join(format!("replica-{i}.log")),
        );
        replica.start()?;
        replicas.replicas.push(replica);
        replicas.metrics_ports.push(metrics);
    }

    // The objects, through the storage version, before the policy exists (until its webhook
    // converts, the CRD's conversion is None: a write through another version would be
    // stored as written, whatever its shape).
    let soak_state = |schedule| {
        Arc::new(Soak {
            client: env.clone_client(),
            group: crd.group.clone(),
            schedule,
            truth: Mutex::new(BTreeMap::new()),
            counts: Counts::default(),
            problems: Mutex::new(Vec::new()),
            excuses: Excuses::default(),
            trimmed_at_revision: Mutex::new(None),
            stop: AtomicBool::new(false),
        })
    };
    // The schedule, compressed, from one origin for the policy and the chaos: introduce and
    // store v1, deprecate, unserve and remove v1alpha1 (fixed once the objects exist).
    let workers = 6u64;
    let mut owned: Vec<Vec<String>> = vec![Vec::new(); workers as usize];
    let placeholder = Schedule {
        introduce_v1: Timestamp::now(),
        store_v1: Timestamp::now(),
        deprecate_v1alpha1: Timestamp::now(),
        unserve_v1alpha1: Timestamp::now(),
        remove_v1alpha1: Timestamp::now(),
    };
    let creator = soak_state(placeholder);
    {
        let mut random = Random(seed);
        let creates = (0..objects).map(|i| {
            let worker = i % workers;
            let name = format!("s{worker}-{:04}", i / workers);
            owned[worker as usize].push(name.clone());
            let mut own = Random(random.next() | 1);
            let creator = creator.clone();
            async move { creator.create(&name, VERSIONS[0], &mut own).await }
        });
        futures::stream::iter(creates.collect::<Vec<_>>())
            .buffer_unordered(16)
            .collect::<Vec<()>>()
            .await;
    }
    let origin = (
        Timestamp::now() + jiff::SignedDuration::from_secs(10),
        Instant::now() + Duration::from_secs(10),
    );
    let at = |fraction: f64| {
        let offset = jiff::SignedDuration::from_secs_f64(seconds as f64 * fraction);
        let exact = origin.0 + offset;
        exact.round(jiff::Unit::Second).unwrap_or(exact)
    };
    let moment = |fraction: f64| origin.1 + Duration::from_secs_f64(seconds as f64 * fraction);
    let schedule = Schedule {
        introduce_v1: at(0.10),
        store_v1: at(0.20),
        deprecate_v1alpha1: at(0.30),
        unserve_v1alpha1: at(0.50),
        remove_v1alpha1: at(0.70),
    };
    let soak = soak_state(schedule);
    // The objects created above, as known.
    *lock(&soak.truth) = std::mem::take(&mut *lock(&creator.truth));
    let creation_problems = lock(&creator.problems).clone();
    ensure!(
        creation_problems.is_empty(),
        "creating the objects: {}",
        creation_problems.join(" | ")
    );

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
    policy["spec"]["conversion"] = crate::scenarios::conversion();
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

    // The clients, and a record of the CRD's versions and storedVersions as they change.
    let mut clients = Clients {
        soak: soak.clone(),
        tasks: Vec::new(),
    };
    for (worker, names) in owned.into_iter().enumerate() {
        clients
            .tasks
            .push(tokio::spawn(soak.clone().worker(worker as u64, seed, names)));
    }
    for version in ["v1beta1", "v1"] {
        clients.tasks.push(tokio::spawn(soak.clone().watcher(version)));
    }
    clients.tasks.push({
        let (client, name, soak) = (env.clone_client(), crd.name.clone(), soak.clone());
        tokio::spawn(async move {
            type Crd =
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
            let api: kube::Api<Crd> = kube::Api::all(client);
            let mut last = String::new();
            // Every state of the CRD, in order: prints each change and notes the revision
            // of the trim.
            let mut note = |crd: &Crd| {
                let flags = crate::flags::of_crd(crd);
                let stored = crd
                    .status
                    .as_ref()
                    .and_then(|s| s.stored_versions.clone())
                    .unwrap_or_default();
                if stored == ["v1"] {
                    let revision = crd
                        .metadata
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse().ok());
                    if let Some(revision) = revision {
                        lock(&soak.trimmed_at_revision).get_or_insert(revision);
                    }
                }
                let now = format!("{flags} stored {}", stored.join(","));
                if now != last {
                    println!("e2e: soak: {} CRD {now}", Timestamp::now());
                    last = now;
                }
            };
            // A read, then a watch from it (every state, so the trim's own revision); when
            // the watch ends or fails (an apiserver restart, a compaction), read again: a
            // trim in that gap is noted at the first state read after it.
            loop {
                let Ok(crd) = api.get(&name).await else {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                };
                note(&crd);
                let from = crd.metadata.resource_version.clone().unwrap_or_default();
                let params = kube::api::WatchParams::default()
                    .fields(&format!("metadata.name={name}"))
                    .timeout(290);
                if let Ok(stream) = api.watch(&params, &from).await {
                    let mut stream = stream.boxed();
                    while let Some(Ok(event)) = stream.next().await {
                        match event {
                            kube::api::WatchEvent::Added(crd) | kube::api::WatchEvent::Modified(crd) => {
                                note(&crd)
                            }
                            kube::api::WatchEvent::Error(_) => break,
                            _ => {}
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    });

    // Chaos, on the same timeline.
    let mut restarts: BTreeMap<&str, u32> = BTreeMap::new();
    let mut second_ca = None;
    let events: [(f64, &str); 6] = [
        (0.15, "kill the leader"),
        (0.28, "rotate the webhook CA"),
        (0.40, "stop the leader"),
        (0.45, "restart the apiserver"),
        (0.62, "compact etcd"),
        (0.75, "restart the other replica"),
    ];
    for (fraction, what) in events {
        replicas.supervise_until(moment(fraction)).await?;
        let holder = lease_holder(env, &lease).await;
        let leader = holder
            .and_then(|h| replicas.replicas.iter().position(|r| r.identity == h))
            .unwrap_or(0);
        println!("e2e: soak: {} {what}", Timestamp::now());
        match what {
            "kill the leader" => {
                // A pod killed (SIGKILL) is replaced by a new pod: a new identity, so that the
                // other replica takes the lease over once it expires.
                let window = soak.excuses.open("a replica killed");
                let replica = &mut replicas.replicas[leader];
                replica.kill();
                soak.excuses.close(window, Duration::from_secs(2));
                replica.identity = format!("{}-soak-{leader}-{}", env.run_id, replica.starts);
                tokio::time::sleep(Duration::from_secs(1)).await;
                replica.start()?;
                *restarts.entry("controller").or_default() += 1;
            }
            "stop the leader" | "restart the other replica" => {
                let index = if what == "stop the leader" {
                    leader
                } else {
                    1 - leader
                };
                let replica = &mut replicas.replicas[index];
                let status = tokio::task::block_in_place(|| replica.terminate(EXIT_AFTER_SIGTERM));
                ensure!(
                    status.is_some(),
                    "replica {} did not stop within {EXIT_AFTER_SIGTERM:?} of SIGTERM",
                    replica.identity
                );
                replica.start()?;
                *restarts
                    .entry(if what == "stop the leader" {
                        "controller"
                    } else {
                        "webhook"
                    })
                    .or_default() += 1;
            }
            "rotate the webhook CA" => {
                second_ca = Some(write_certificates(&certs, &host, 2)?);
                *restarts.entry("CA rotation").or_default() += 1;
            }
            "restart the apiserver" => {
                if let Some(plane) = plane {
                    let window = soak.excuses.open("the apiserver restarting");
                    plane.restart_apiserver().await?;
                    soak.excuses.close(window, Duration::from_secs(3));
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
    replicas.supervise_until(moment(1.0)).await?;
    soak.stop.store(true, Ordering::Relaxed);
    for task in clients.tasks.drain(..).take(8) {
        let _ = task.await;
    }

    // The policy reaches its end: v1 stored, every object migrated, v1alpha1 removed.
    let mut settled = async {
        wait_for(
            "storedVersions is [v1] and v1alpha1 is removed",
            Duration::from_secs(240),
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
        wait_for(
            "the migration reports its success",
            Duration::from_secs(60),
            || async {
                let migration = env.policy(&policy_name).await?["status"]["migration"].clone();
                Ok(migration["phase"] == "Succeeded" && migration["storageVersion"] == "v1")
            },
        )
        .await
    }
    .boxed();
    let settled = loop {
        tokio::select! {
            done = &mut settled => break done,
            () = tokio::time::sleep(Duration::from_millis(250)) => replicas.supervise()?,
        }
    };
    settled?;

    // Nothing lost: every object that should exist reads through every served version with
    // its latest content.
    let truth_now: Vec<(String, bool, bool, i64)> = lock(&soak.truth)
        .iter()
        .map(|(name, t)| {
            let exists = !t.deleted && !t.delete_unsure && t.current > 0;
            let maybe = t.delete_unsure || t.unsure || (t.current == 0 && !t.deleted);
            (name.clone(), exists, maybe, t.current)
        })
        .collect();
    let expected: BTreeSet<&String> = truth_now.iter().filter(|t| t.1).map(|t| &t.0).collect();
    let maybe: BTreeSet<&String> = truth_now.iter().filter(|t| t.2).map(|t| &t.0).collect();
    for version in ["v1beta1", "v1"] {
        let items = env.list_via(&crd, version).await?;
        let mut listed = BTreeSet::new();
        for item in &items {
            let name = item["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            soak.check(item, version, "final list", None);
            let generation = item["metadata"]["generation"].as_i64().unwrap_or(0);
            if let Some((_, _, unsure, current)) = truth_now.iter().find(|t| t.0 == name)
                && generation != *current
                && !unsure
            {
                soak.problem(format!(
                    "lost: {name} through {version} ends at generation {generation}, its last write made {current}"
                ));
            }
            listed.insert(name);
        }
        for name in expected.iter().filter(|n| !listed.contains(n.as_str())) {
            soak.problem(format!(
                "lost: {name} is missing from the final list through {version}"
            ));
        }
        for name in listed
            .iter()
            .filter(|n| !expected.contains(n) && !maybe.contains(n))
        {
            soak.problem(format!(
                "wrong: {name} is listed through {version} but was deleted"
            ));
        }
    }
    // Every object is stored in the storage version (checked in etcd itself).
    if let Some(plane) = plane {
        let prefix = format!("/registry/{}/widgets/", crd.group);
        let stored = plane.etcd().list(&prefix).await?;
        for (key, object) in &stored {
            if object["apiVersion"] != format!("{}/v1", crd.group).as_str() {
                soak.problem(format!(
                    "lost: {key} is stored in etcd as {}",
                    object["apiVersion"]
                ));
            }
        }
        let in_etcd: BTreeSet<String> = stored
            .iter()
            .map(|(k, _)| k.trim_start_matches(&prefix).to_owned())
            .collect();
        for name in expected.iter().filter(|n| !in_etcd.contains(n.as_str())) {
            soak.problem(format!("lost: {name} is not in etcd"));
        }
    }
    // The CA rotation reached the CRD, and both replicas serve the new certificate.
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
        if !bundle.contains(ca.trim()) {
            soak.problem(
                "rotation: the CRD's caBundle does not hold the rotated CA after the run".to_owned(),
            );
        }
        for port in webhook_ports {
            // A replica restarted late in the run (a SIGTERM'd one takes up to
            // EXIT_AFTER_SIGTERM to exit, which can push the last restart to the run's end),
            // or one that exits by itself meanwhile (a lease lost across the apiserver's
            // restart) and is started again here, gets up to a minute to serve again.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            let mut serving = false;
            while tokio::time::Instant::now() < deadline {
                replicas.supervise()?;
                if serves_certificate_of(&host, port, ca).await {
                    serving = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            if !serving {
                soak.problem(format!(
                    "rotation: the replica on port {port} does not serve a certificate of the rotated CA"
                ));
            }
        }
    }
    // Both replicas converted: the apiserver's connections moved between them.
    replicas.scraped_at = None;
    replicas.scrape().await;
    let served: Vec<u64> = replicas.served.iter().map(|(total, _)| *total).collect();
    println!("e2e: soak: conversions answered by each replica: {served:?}");
    if served.contains(&0) {
        soak.problem(format!("spread: a replica answered no conversion: {served:?}"));
    }
    for (identity, status, lease_lost) in &replicas.exits {
        if !lease_lost {
            soak.problem(format!(
                "exit: replica {identity} exited by itself ({status}) without losing its lease"
            ));
        }
    }

    let problems = lock(&soak.problems).clone();
    let count = |kind: &str| problems.iter().filter(|p| p.starts_with(kind)).count();
    let counts = &soak.counts;
    let restarts_text = restarts
        .iter()
        .map(|(what, n)| format!("{what} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    println!(
        "soak: {seconds}s, {} objects at the end: reads {}, writes {}, conversions checked {}, watch events {}, restarts {} ({restarts_text}; replicas that exited by themselves and were restarted {}), wrong {}, lost {}, refused through served versions {}, refused through unserved versions {}, conflicts {}, transient failures {}, expired lists {}, continued pages from before the migration refused {}",
        expected.len(),
        counts.reads.load(Ordering::Relaxed),
        counts.writes.load(Ordering::Relaxed),
        counts.conversions_checked.load(Ordering::Relaxed),
        counts.watch_events.load(Ordering::Relaxed),
        restarts.values().sum::<u32>(),
        replicas.exits.len(),
        count("wrong"),
        count("lost"),
        count("refused"),
        counts.refused_unserved.load(Ordering::Relaxed),
        counts.conflicts.load(Ordering::Relaxed),
        counts.transient.load(Ordering::Relaxed),
        counts.expired_lists.load(Ordering::Relaxed),
        counts.stale_snapshot_pages.load(Ordering::Relaxed),
    );
    for replica in &mut replicas.replicas {
        tokio::task::block_in_place(|| replica.terminate(EXIT_AFTER_SIGTERM));
    }
    drop(clients);
    drop(balancer);
    if problems.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(());
    }
    // Up to three examples of each kind of problem; the replicas' logs are kept.
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
    Err(format!(
        "{} problems (replica logs in {}); {}",
        problems.len(),
        dir.display(),
        examples.join(" || ")
    ))
}

async fn lease_holder(env: &Env, lease: &str) -> Option<String> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(env.client.clone(), "default");
    leases.get_opt(lease).await.ok()??.spec?.holder_identity
}
