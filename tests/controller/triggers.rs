//! The whole controller (`controller::controller`: its watches, what starts a reconcile, the
//! reconciles) against the fake apiserver's watches (tests/fixtures/watch/): a reconcile's
//! own writes (its status, the finalizer, its CRD patch) start no further reconcile, while
//! what it acts on (a CRD changed by hand, an approval, a job's phase) does.

use super::*;
use apiserver::CheckedFake;
use crd_lifecycle::controller::http::Health;
use crd_lifecycle::controller::jobs::MIGRATION_FIELD_MANAGER;
use crd_lifecycle::controller::status::apply_status;
use crd_lifecycle::controller::{RunSettings, controller};
use std::collections::BTreeMap;

/// The controller running on its own task, with a clock that follows tokio's (paused) one.
struct Running {
    fake: CheckedFake,
    metrics: Arc<Metrics>,
    task: tokio::task::JoinHandle<()>,
    start: Timestamp,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Running {
    fn start(fake: FakeApiserver) -> Running {
        let start = ts("2026-01-01T00:00:00Z");
        let origin = tokio::time::Instant::now();
        let clock: crd_lifecycle::clock::Clock =
            Arc::new(move || start + jiff::SignedDuration::try_from(origin.elapsed()).expect("a short test"));
        let metrics = Arc::new(Metrics::default());
        let settings = RunSettings {
            metrics_address: "127.0.0.1:0".parse().expect("address"),
            lease: None,
            resync: Duration::from_secs(600),
            identity: "test".into(),
            parallel_migrations: 2,
            traffic_sample_interval: Duration::from_secs(60),
            webhook: None,
            svm_pending_deadline: Duration::from_secs(600),
        };
        let running = controller(
            fake.client(),
            settings,
            metrics.clone(),
            Arc::new(Health::default()),
            None,
            clock,
            std::future::pending(),
        );
        let task = tokio::spawn(async move {
            running.await.expect("the controller runs");
        });
        Running {
            fake: CheckedFake(fake),
            metrics,
            task,
            start,
        }
    }

    /// An RFC 3339 instant `seconds` after the controller's start.
    fn at(&self, seconds: i64) -> String {
        (self.start + jiff::SignedDuration::from_secs(seconds)).to_string()
    }

    /// Reconciles per policy so far: each reconcile applies the policy's status once (as
    /// `crd-lifecycle`, whether or not anything changed).
    fn reconciles(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for request in self.fake.requests() {
            let status_apply = request.method == "PATCH"
                && request.path.ends_with("/status")
                && request.path.contains("/versionpolicies/")
                && request.query_param("fieldManager") == "crd-lifecycle";
            if status_apply {
                let name = request.path.rsplit('/').nth(1).unwrap_or_default().to_owned();
                *counts.entry(name).or_default() += 1;
            }
        }
        counts
    }

    fn total(&self) -> usize {
        self.reconciles().values().sum()
    }
}

fn fleet_crd(i: usize) -> Value {
    let version = |name: &str, served: bool, storage: bool| {
        json!({"name": name, "served": served, "storage": storage,
               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
    };
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": format!("widgets{i}.example.com")},
           "spec": {"group": "example.com", "names": {"kind": format!("Widget{i}"), "plural": format!("widgets{i}")},
                    "scope": "Namespaced", "versions": [version("v1", true, true), version("v2", false, false)]}})
}

/// Introduces v2 at `at`; v1's deprecation at `deprecate_at` needs an approval.
fn fleet_policy(i: usize, at: &str, deprecate_at: &str) -> Value {
    json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
           "metadata": {"name": format!("p{i}"), "uid": format!("uid-p{i}"),
                        "creationTimestamp": "2025-12-01T00:00:00Z"},
           "spec": {"crdName": format!("widgets{i}.example.com"),
                    "versions": [{"name": "v1", "deprecate": {"at": deprecate_at, "approval": "Required"}},
                                 {"name": "v2", "introduce": {"at": at}}],
                    "migration": {"enabled": false}}})
}

fn served(fake: &FakeApiserver, crd: &str, version: &str) -> bool {
    fake.crd(crd)["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| v["name"] == version && v["served"] == true)
}

/// `policies` fleet CRDs and the controller running, then one policy per CRD introducing v2
/// a minute on, and 30 s for their creation to come to rest.
async fn fleet(policies: usize) -> (FakeApiserver, Running) {
    let fake = FakeApiserver::new();
    for i in 0..policies {
        fake.create_crd(fleet_crd(i));
    }
    let running = Running::start(fake.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Every policy introduces v2 at the same instant, a minute on.
    let (introduce, deprecate) = (running.at(60), running.at(3600));
    for i in 0..policies {
        fake.create_policy(fleet_policy(i, &introduce, &deprecate));
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    (fake, running)
}

#[tokio::test(start_paused = true)]
async fn a_policy_costs_at_most_three_reconciles_from_creation_to_rest() {
    const POLICIES: usize = 20;
    let (fake, running) = fleet(POLICIES).await;
    let created = running.reconciles();
    assert_eq!(created.len(), POLICIES, "{created:?}");
    tokio::time::sleep(Duration::from_secs(60)).await;
    for i in 0..POLICIES {
        assert!(
            served(&fake, &format!("widgets{i}.example.com"), "v2"),
            "p{i} introduced v2"
        );
        let history = &fake.policy(&format!("p{i}"))["status"]["history"];
        assert_eq!(history[0]["milestone"], "introduce", "p{i}: {history}");
    }
    // Creation to rest (the target is at most 3): one reconcile when created (finalizer,
    // status), one at the instant (the patch, the status); none for the watch echoes of
    // either.
    let reconciles = running.reconciles();
    assert!(created.values().all(|n| *n == 1), "after creation: {created:?}");
    assert!(
        reconciles.values().all(|n| *n == 2),
        "reconciles per policy: {reconciles:?} (after creation: {created:?})"
    );
    assert_eq!(running.metrics.reconciles.get() as usize, running.total());
    // The reconcile at the instant finds its own last status write in the cache: it reads
    // no policy (the first one does, with nothing written yet).
    let reads = running
        .fake
        .requests()
        .iter()
        .filter(|r| {
            r.method == "GET"
                && r.path
                    .starts_with("/apis/crdlifecycle.io/v1alpha1/versionpolicies/")
        })
        .count();
    assert_eq!(reads, POLICIES);
    // The reconcile at creation reads its CRD from the watch cache, at least as new as the
    // watch saw it (`resourceVersion` on a GET: not older than); the one at the instant
    // reads nothing (the CRD as kept from that read, the watch having seen nothing newer),
    // and its patch is guarded by that resourceVersion.
    for i in 0..POLICIES {
        let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets{i}.example.com");
        let requests = running.fake.requests();
        let reads: Vec<_> = requests
            .iter()
            .filter(|r| r.method == "GET" && r.path == path)
            .collect();
        assert_eq!(reads.len(), 1, "widgets{i}: one read");
        let patch = requests
            .iter()
            .find(|r| r.method == "PATCH" && r.path == path)
            .expect("the introduction's patch");
        let guard = &patch.body[0];
        assert_eq!(guard["path"], "/metadata/resourceVersion", "{}", patch.body);
        assert_eq!(
            reads[0].query_param("resourceVersion"),
            guard["value"].as_str().expect("a resourceVersion"),
            "widgets{i}: read with {:?}",
            reads[0].query
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_kept_crd_changed_before_the_watch_tells_is_read_again_at_the_refused_patch() {
    let (fake, running) = fleet(1).await;
    // Someone adds a version by hand; the watch tells only a minute later, after the
    // instant, so the reconcile at the instant decides on the CRD as kept.
    fake.lock().watch_delay = Duration::from_secs(60);
    let crd = "widgets0.example.com";
    fake.edit_crd(crd, |crd| {
        crd["spec"]["versions"].as_array_mut().expect("versions").push(json!({
            "name": "v3", "served": false, "storage": false,
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}));
    });
    tokio::time::sleep(Duration::from_secs(40)).await;
    // Its guarded patch was refused (422, apiserver-samples/03); it read the CRD again from
    // etcd and patched the CRD as it is: v2 served, v3 kept.
    assert!(served(&fake, crd, "v2"));
    let versions: Vec<Value> = fake.crd(crd)["spec"]["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .map(|v| v["name"].clone())
        .collect();
    assert_eq!(versions, [json!("v1"), json!("v2"), json!("v3")]);
    let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}");
    let requests = running.fake.requests();
    let patches = requests
        .iter()
        .filter(|r| r.method == "PATCH" && r.path == path)
        .count();
    assert_eq!(patches, 2, "the refused patch and the one after the quorum read");
    let quorum_reads = requests
        .iter()
        .filter(|r| r.method == "GET" && r.path == path && r.query_param("resourceVersion").is_empty())
        .count();
    assert!(quorum_reads >= 1);
}

#[tokio::test(start_paused = true)]
async fn what_a_reconcile_acts_on_starts_one_and_its_own_writes_do_not() {
    let fake = FakeApiserver::new();
    fake.create_crd(fleet_crd(0));
    let running = Running::start(fake.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    fake.create_policy(fleet_policy(0, &running.at(10), &running.at(20)));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(served(&fake, "widgets0.example.com", "v2"));
    assert_eq!(
        fake.policy("p0")["status"]["conditions"][3]["reason"],
        "AwaitingApproval",
        "{}",
        fake.policy("p0")["status"]
    );
    let at_rest = running.total();

    // A CRD changed by hand (a GitOps tool re-applying an old copy) is corrected.
    fake.edit_crd("widgets0.example.com", |crd| {
        crd["spec"]["versions"][1]["served"] = json!(false)
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        served(&fake, "widgets0.example.com", "v2"),
        "the drift is corrected"
    );
    assert!(
        fake.event_summaries()
            .iter()
            .any(|(_, reason, _)| reason == "DriftCorrected"),
        "{:?}",
        fake.event_summaries()
    );
    assert_eq!(
        running.total(),
        at_rest + 1,
        "one reconcile for the edit, none for its own patch"
    );

    // A job's progress (counts, by its own field manager) starts none; its end does.
    let client = fake.client();
    let progress = |phase: &str, listed: u64| {
        json!({"migration": {"phase": phase, "storageVersion": "v1", "listed": listed,
                             "rewritten": listed, "skipped": 0, "failed": 0}})
    };
    apply_status(&client, "p0", MIGRATION_FIELD_MANAGER, progress("Running", 0))
        .await
        .expect("status");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let running_job = running.total();
    assert_eq!(running_job, at_rest + 2, "a job that starts is a change");
    for listed in [500, 1000, 1500] {
        apply_status(
            &client,
            "p0",
            MIGRATION_FIELD_MANAGER,
            progress("Running", listed),
        )
        .await
        .expect("status");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert_eq!(running.total(), running_job, "progress starts no reconcile");
    apply_status(
        &client,
        "p0",
        MIGRATION_FIELD_MANAGER,
        progress("Succeeded", 2000),
    )
    .await
    .expect("status");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(running.total(), running_job + 1, "the job's end is a change");

    // The approval annotation starts the held deprecation.
    fake.edit_policy("p0", |policy| {
        policy["metadata"]["annotations"] = json!({"crdlifecycle.io/approve": "v1.deprecate"})
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    let v1 = fake.crd("widgets0.example.com")["spec"]["versions"][0].clone();
    assert_eq!(v1["deprecated"], true, "{v1}");
    assert_eq!(running.total(), running_job + 2, "one reconcile for the approval");
}

#[tokio::test(start_paused = true)]
async fn a_reconcile_from_a_cache_behind_its_last_status_write_writes_nothing_new() {
    let mut h = Harness::with_example();
    h.at("2025-12-01T00:00:00Z");
    let stale: DeserializeGuard<VersionPolicy> =
        serde_json::from_value(h.fake.policy("widgets")).expect("decodes");
    h.reconcile("widgets").await;
    let written = h.fake.policy("widgets");
    assert!(written["status"]["conditions"].is_array(), "{written}");
    // Seconds later, a reconcile whose cached policy predates that write (many policies
    // reconciled at once, a slow watch): the same conditions, so the status apply changes
    // nothing and sends no watch event.
    h.at("2025-12-01T00:00:07Z");
    reconcile(Arc::new(stale), h.ctx.clone())
        .await
        .expect("reconciles");
    let again = h.fake.policy("widgets");
    assert_eq!(again["status"], written["status"]);
    assert_eq!(
        again["metadata"]["resourceVersion"], written["metadata"]["resourceVersion"],
        "nothing written"
    );
}

#[tokio::test(start_paused = true)]
async fn a_transition_lands_at_its_instant_however_long_the_reconcile_before_took() {
    let fake = FakeApiserver::new();
    fake.create_crd(fleet_crd(0));
    // A loaded apiserver: every status write takes 5 s.
    fake.lock().status_latency = Duration::from_secs(5);
    let running = Running::start(fake.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let origin = tokio::time::Instant::now();
    // Due 30 s after the policy is created (30 s on the controller's clock, which runs a
    // second ahead of `origin`).
    fake.create_policy(fleet_policy(0, &running.at(31), &running.at(3600)));
    tokio::time::sleep(Duration::from_secs(60)).await;
    let patch = fake
        .crd_writes()
        .into_iter()
        .find(|r| r.path.ends_with("/widgets0.example.com"))
        .expect("the CRD was patched");
    let late = patch
        .at
        .duration_since(origin)
        .saturating_sub(Duration::from_secs(30));
    // The reconcile at creation took 5 s; the one at the instant starts on time (its own
    // status write comes after the patch).
    assert!(late < Duration::from_millis(100), "landed {late:?} late");
}

#[tokio::test(start_paused = true)]
async fn a_reconciles_events_and_status_wait_for_the_patches_of_others_on_their_way() {
    let mut h = Harness::with_example();
    h.at("2026-01-05T00:00:01Z");
    h.sync_store();
    // Another reconcile is reading its CRD, about to patch it.
    let other = h.ctx.patches_first.on_the_way();
    let policy: DeserializeGuard<VersionPolicy> =
        serde_json::from_value(h.fake.policy("widgets")).expect("decodes");
    let reconciling = tokio::spawn(reconcile(Arc::new(policy), h.ctx.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    // This one's transition landed; its Events and status wait.
    assert!(h.flags().contains("v1beta1:sS"), "{}", h.flags());
    assert!(h.fake.events().is_empty());
    assert!(h.status("widgets").is_null());
    drop(other);
    reconciling.await.expect("no panic").expect("reconciles");
    assert_eq!(h.status("widgets")["history"][0]["milestone"], "store");
    assert!(!h.fake.events().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_burst_writes_its_bookkeeping_once_its_patches_reach_watchers() {
    const POLICIES: usize = 5;
    let (fake, running) = fleet(POLICIES).await;
    // From now on the watches deliver each change 2 s after its write was answered.
    fake.lock().watch_delay = Duration::from_secs(2);
    let before_instant = running.fake.requests().len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let requests = running.fake.requests();
    let burst = &requests[before_instant..];
    let patches: Vec<_> = burst
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.contains("/customresourcedefinitions/"))
        .collect();
    let statuses: Vec<_> = burst
        .iter()
        .filter(|r| {
            r.method == "PATCH" && r.path.ends_with("/status") && r.path.contains("/versionpolicies/")
        })
        .collect();
    assert_eq!(patches.len(), POLICIES);
    assert_eq!(statuses.len(), POLICIES);
    let last_patch = patches.iter().map(|r| r.at).max().expect("patches");
    let first_status = statuses.iter().map(|r| r.at).min().expect("statuses");
    // Every policy's status waits for every patch to be delivered by the watch.
    assert!(
        first_status >= last_patch + Duration::from_secs(2),
        "the first status write came {:?} after the last patch",
        first_status - last_patch
    );
    // And no longer than that.
    assert!(first_status < last_patch + Duration::from_secs(3));
}
