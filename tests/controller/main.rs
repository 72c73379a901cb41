//! Controller tests: `reconcile` against kube's `Client` over an in-process fake apiserver.

#[path = "../support/apiserver/mod.rs"]
mod apiserver;
#[path = "../support/flags.rs"]
mod flags;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use apiserver::FakeApiserver;
use crd_lifecycle::api::VersionPolicy;
use crd_lifecycle::controller::jobs::BackgroundJobs;
use crd_lifecycle::controller::metrics::Metrics;
use crd_lifecycle::controller::traffic::TrafficMonitor;
use crd_lifecycle::controller::writers_gate::WritersGateReads;
use crd_lifecycle::controller::{Context, reconcile};
use jiff::Timestamp;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};

const EXAMPLE_POLICY: &str = include_str!("../../examples/widgets/policy.yaml");
const EXAMPLE_CRD: &str = include_str!("../../examples/widgets/crd.yaml");
const CRD: &str = "widgets.example.com";

struct Harness {
    fake: FakeApiserver,
    ctx: Arc<Context>,
    writer: Writer<DeserializeGuard<VersionPolicy>>,
    clock: Arc<Mutex<Timestamp>>,
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).expect("valid YAML")
}

fn ts(text: &str) -> Timestamp {
    text.parse().expect("instant")
}

impl Harness {
    fn new() -> Self {
        let fake = FakeApiserver::new();
        let client = fake.client();
        let (store, writer) = reflector::store();
        let clock = Arc::new(Mutex::new(ts("2025-12-01T00:00:00Z")));
        let now = clock.clone();
        let ctx = test_context(client, Arc::new(move || *now.lock().expect("clock")), store);
        Self {
            fake,
            ctx,
            writer,
            clock,
        }
    }

    /// The example CRD and policy, as applied with kubectl, with migrations turned off so
    /// that the CRD moves only by transitions (and `storedVersions` by `trim_stored_versions`).
    fn with_example() -> Self {
        let mut harness = Self::new();
        harness.fake.create_crd(yaml(EXAMPLE_CRD));
        let mut policy = yaml(EXAMPLE_POLICY);
        policy["spec"]["migration"]["enabled"] = json!(false);
        harness.add_policy(policy, "2025-11-01T00:00:00Z");
        harness
    }

    /// The example with migrations on, and `objects` widgets stored as v1alpha1.
    fn with_example_and_objects(objects: usize) -> Self {
        let mut harness = Self::new();
        harness.fake.create_crd(yaml(EXAMPLE_CRD));
        harness.fake.add_objects(CRD, objects, 4, "v1alpha1");
        harness.add_policy(yaml(EXAMPLE_POLICY), "2025-11-01T00:00:00Z");
        harness
    }

    /// The same controller, serving a conversion webhook at `endpoint`.
    fn serve_webhook(&mut self, endpoint: Arc<crd_lifecycle::webhook::ca::WebhookEndpoint>) {
        let migrations = self.ctx.jobs.clone();
        self.replace_context(migrations, Some(endpoint));
    }

    /// A controller sharing this one's cluster, cache, clock and metrics, with another
    /// migration manager (a restarted controller) and webhook.
    fn replace_context(
        &mut self,
        migrations: Arc<BackgroundJobs>,
        webhook: Option<Arc<crd_lifecycle::webhook::ca::WebhookEndpoint>>,
    ) {
        self.ctx = Arc::new(self.ctx.rebuild().jobs(migrations).webhook(webhook).build());
    }

    /// A new leader (or this controller restarted): the same cluster, cache, clock and
    /// webhook, and a migration manager that remembers nothing.
    fn new_leader(&mut self) {
        let ctx = &self.ctx;
        let migrations = test_migrations(
            ctx.client.clone(),
            ctx.recorder.clone(),
            ctx.metrics.clone(),
            ctx.clock.clone(),
        );
        let webhook = ctx.webhook.clone();
        self.replace_context(Arc::new(migrations), webhook);
    }

    /// Applies `status` to the policy `widgets` as field manager `manager` (what another
    /// controller, or an earlier release, wrote).
    async fn apply_status_as(&mut self, manager: &str, status: Value) {
        crd_lifecycle::controller::status::apply_status(&self.ctx.client, "widgets", manager, status)
            .await
            .expect("status applied");
        self.sync_store();
    }

    /// Objects read one by one through `version` (GETs of single objects), so far.
    fn object_reads(&self, version: &str) -> usize {
        let prefix = format!("/apis/example.com/{version}/namespaces/");
        self.fake
            .object_requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.starts_with(&prefix))
            .count()
    }

    fn at(&self, instant: &str) {
        *self.clock.lock().expect("clock") = ts(instant);
    }

    fn add_policy(&mut self, mut policy: Value, created: &str) {
        let name = policy["metadata"]["name"].as_str().expect("name").to_owned();
        policy["metadata"]["creationTimestamp"] = json!(created);
        policy["metadata"]["generation"] = json!(1);
        policy["metadata"]["uid"] = json!(format!("uid-{name}"));
        self.fake.create_policy(policy);
        self.sync_store();
    }

    fn edit_policy(&mut self, name: &str, edit: impl FnOnce(&mut Value)) {
        let mut policy = self.fake.policy(name);
        edit(&mut policy);
        policy["metadata"]["generation"] = json!(policy["metadata"]["generation"].as_i64().unwrap_or(1) + 1);
        self.fake.create_policy(policy);
        self.sync_store();
    }

    /// Mirrors the fake's policies into the controller's cache, as the watch would.
    fn sync_store(&mut self) {
        let policies: Vec<DeserializeGuard<VersionPolicy>> = self
            .fake
            .lock()
            .policies
            .values()
            .map(|p| serde_json::from_value(p.clone()).expect("decodes"))
            .collect();
        self.writer.apply_watcher_event(&watcher::Event::Init);
        for policy in policies {
            self.writer
                .apply_watcher_event(&watcher::Event::InitApply(policy));
        }
        self.writer.apply_watcher_event(&watcher::Event::InitDone);
    }

    async fn reconcile(&mut self, name: &str) -> Action {
        self.sync_store();
        let object: DeserializeGuard<VersionPolicy> =
            serde_json::from_value(self.fake.policy(name)).expect("decodes");
        reconcile(Arc::new(object), self.ctx.clone())
            .await
            .expect("reconcile succeeds")
    }

    fn status(&self, name: &str) -> Value {
        self.fake.policy(name)["status"].clone()
    }

    fn condition(&self, name: &str, type_: &str) -> (String, String, String) {
        let status = self.status(name);
        let condition = status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
            .cloned()
            .unwrap_or(Value::Null);
        (
            condition["status"].as_str().unwrap_or_default().to_owned(),
            condition["reason"].as_str().unwrap_or_default().to_owned(),
            condition["message"].as_str().unwrap_or_default().to_owned(),
        )
    }

    /// The CRD's versions as `name:flags` (s served, S storage, d deprecated).
    fn flags(&self) -> String {
        let crd = self.fake.crd(CRD);
        crd["spec"]["versions"]
            .as_array()
            .expect("versions")
            .iter()
            .map(|v| {
                let letters =
                    flags::letters(v["served"] == true, v["storage"] == true, v["deprecated"] == true);
                format!("{}:{letters}", v["name"].as_str().unwrap_or_default())
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The recorded conversion preflight through `version`: its entry of
    /// `status.preflights`, else the single `status.preflight` of an earlier release.
    fn preflight(&self, name: &str, version: &str) -> Value {
        preflight_of(&self.fake, name, version)
    }

    fn stored_versions(&self) -> Value {
        self.fake.crd(CRD)["status"]["storedVersions"].clone()
    }

    /// Reconciles; while a `store` waits for its conversion preflight (which runs in the
    /// background), waits for the preflight's result and reconciles again, as the
    /// preflight's status write would make the controller do.
    async fn reconcile_through_preflight(&mut self, name: &str) {
        self.reconcile(name).await;
        for _ in 0..3 {
            if self.condition(name, "Blocked").1 != "AwaitingPreflight" {
                return;
            }
            let fake = self.fake.clone();
            wait_until("the preflights end", || {
                let status = fake.policy(name)["status"].clone();
                let mut recorded = status["preflights"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .chain(Some(status["preflight"].clone()).filter(|p| !p.is_null()))
                    .peekable();
                recorded.peek().is_some()
                    && recorded.all(|p| p["phase"] == "Succeeded" || p["phase"] == "Failed")
            })
            .await;
            self.reconcile(name).await;
        }
    }

    /// Reconciles; while a removal waits for the managedFields cleanup, waits for that
    /// cleanup (a background task) and reconciles again.
    async fn reconcile_through_cleanup(&mut self, name: &str) {
        self.reconcile(name).await;
        for _ in 0..3 {
            if self.condition(name, "Blocked").1 != "AwaitingManagedFieldsCleanup" {
                return;
            }
            let fake = self.fake.clone();
            let unserved: Vec<String> = self.fake.crd(CRD)["spec"]["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|v| v["served"] == false && v["storage"] == false)
                .filter_map(|v| v["name"].as_str().map(str::to_owned))
                .collect();
            wait_until("the managedFields cleanup ends", || {
                let cleanup = fake.policy(name)["status"]["managedFieldsCleanup"].clone();
                let covers = unserved.iter().all(|v| {
                    cleanup["versions"]
                        .as_array()
                        .is_some_and(|vs| vs.contains(&json!(v)))
                });
                covers && (cleanup["phase"] == "Succeeded" || cleanup["phase"] == "Failed")
            })
            .await;
            self.reconcile(name).await;
        }
    }

    /// What the migrator does once every object is rewritten.
    fn trim_stored_versions(&self, to: &[&str]) {
        self.fake
            .edit_crd(CRD, |crd| crd["status"]["storedVersions"] = json!(to));
    }
}

/// The recorded conversion preflight of policy `name` through `version` (see
/// `Harness::preflight`); `Null` when there is none.
fn preflight_of(fake: &FakeApiserver, name: &str, version: &str) -> Value {
    let status = fake.policy(name)["status"].clone();
    status["preflights"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["version"] == version)
        .cloned()
        .or(Some(status["preflight"].clone()).filter(|p| p["version"] == version))
        .unwrap_or(Value::Null)
}

/// Polls until `check` holds: migrations and preflights run on their own tasks. The tests
/// run on tokio's paused clock, so each sleep here advances virtual time as soon as those
/// tasks are idle, and the bound (5 s) is virtual too.
async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

mod audit;
mod builtin_migration;
mod decide;
mod findings;
mod gates;
mod kstatus;
mod lifecycle;
mod migration;
mod operations;
mod preflight_ahead;
mod safety;
mod sequence;
mod triggers;
mod webhook;
mod webhook_drain;
mod webhook_limits;
mod webhook_rotation;

/// Discovery confirmations 1 ms apart, so that tests do not wait seconds for a switch.
pub fn fast_settle_check() -> crd_lifecycle::migrate::SettleCheck {
    crd_lifecycle::migrate::SettleCheck {
        confirmations: 3,
        interval: Duration::from_millis(1),
        timeout: Duration::from_secs(5),
        ..crd_lifecycle::migrate::SettleCheck::default()
    }
}

impl Drop for Harness {
    /// A request the fake does not serve fails the test, naming the method and path.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.fake.assert_only_known_requests();
        }
    }
}

/// The controller's shared context for tests: migrations that retry and settle fast.
pub fn test_context(
    client: kube::Client,
    clock: crd_lifecycle::clock::Clock,
    policies: kube::runtime::reflector::Store<
        kube::core::DeserializeGuard<crd_lifecycle::api::VersionPolicy>,
    >,
) -> Arc<Context> {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "crd-lifecycle".into(),
            instance: Some("test".into()),
        },
    );
    let metrics = Arc::new(Metrics::default());
    let migrations = test_migrations(client.clone(), recorder.clone(), metrics.clone(), clock.clone());
    let writers = WritersGateReads::new(client.clone()).with_retry(test_retry());
    Arc::new(
        Context::builder(client.clone(), policies)
            .recorder(recorder)
            .metrics(metrics)
            .clock(clock)
            .jobs(Arc::new(migrations))
            .traffic(TrafficMonitor::new(client, Duration::from_secs(1)))
            .writers(Arc::new(writers))
            .build(),
    )
}

/// The controller's migration manager for tests: 2 at once, fast retries and settle checks,
/// 100 ms after a failure before the next run.
fn test_migrations(
    client: kube::Client,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    clock: crd_lifecycle::clock::Clock,
) -> BackgroundJobs {
    BackgroundJobs::new(client, recorder, metrics, 2)
        .with_progress_interval(Duration::from_millis(20))
        .with_retry_after_failure(Duration::from_millis(100))
        .with_retry(test_retry())
        .with_settle_check(fast_settle_check())
        .with_clock(clock)
}

/// Fast retries for tests.
fn test_retry() -> crd_lifecycle::migrate::RetryPolicy {
    crd_lifecycle::migrate::RetryPolicy {
        attempts: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
    }
}
