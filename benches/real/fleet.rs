//! A fleet of policies due at the same second, run by `crd-lifecycle run` on the real
//! apiserver.
//!
//! N CRDs (versions v1 served and stored, v2 and v3 not served). First a raw client makes N
//! JSON patches serving v2, all at once (as the controller's reconciles run: unbounded), and
//! back, four passes, each from a new client (as cold as the controller's connections after
//! a quiet while). Then the controller starts and N policies are created: v2 is introduced
//! at the same second T1 for all of them, v3 at T2, a while later (two bursts). A patch
//! lands when the apiserver answers it (the raw client's answers; the controller's
//! "patched CRD" log lines, written as each answer arrives); clients see it when a watch
//! delivers it (one CRD watch runs throughout, for both). The controller's
//! `crd_lifecycle_reconciles_total` gives the reconciles per policy from creation to rest
//! after T1 (no reconcile for 10 s), and its debug log why each one ran.

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::Figure;
use crate::cluster::{Cluster, crd, percentile};
use crate::control_plane::free_port;

const GROUP: &str = "fleet.bench.example.com";
/// How long without a reconcile counts as rest.
const REST: Duration = Duration::from_secs(10);

/// The controller as a child process, killed when dropped.
struct Controller {
    child: Child,
    metrics_port: u16,
    log: std::path::PathBuf,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Controller {
    fn start(cluster: &Cluster) -> Result<Controller, String> {
        let metrics_port = free_port()?;
        let log = std::env::temp_dir().join(format!("crd-lifecycle-bench-fleet-{}.log", std::process::id()));
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let child = Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"))
            .args(["run", "--leader-election=false"])
            .arg(format!("--metrics-addr=127.0.0.1:{metrics_port}"))
            .env("KUBECONFIG", &cluster.kubeconfig)
            // The reconcile's debug line carries kube-runtime's reason for it.
            .env("RUST_LOG", "info,crd_lifecycle::controller::reconcile=debug")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .map_err(|e| format!("cannot start crd-lifecycle run: {e}"))?;
        Ok(Controller {
            child,
            metrics_port,
            log,
        })
    }

    async fn get(&self, path: &str) -> Result<(u16, String), String> {
        crate::control_plane::plain_http(self.metrics_port, "GET", path, None).await
    }

    async fn wait_ready(&self) -> Result<(), String> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            if let Ok((200, _)) = self.get("/readyz").await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!(
            "the controller was not ready within 60 s (log: {})",
            self.log.display()
        ))
    }

    /// `crd_lifecycle_reconciles_total`.
    async fn reconciles(&self) -> Result<u64, String> {
        let (_, text) = self.get("/metrics").await?;
        text.lines()
            .find_map(|l| l.strip_prefix("crd_lifecycle_reconciles_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
            .ok_or_else(|| "no crd_lifecycle_reconciles_total in /metrics".to_owned())
    }

    /// Waits until no reconcile ran for `REST` (at most `limit`); the count then.
    async fn wait_rest(&self, limit: Duration) -> Result<u64, String> {
        let started = Instant::now();
        let mut last = self.reconciles().await?;
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.reconciles().await?;
            if now != last {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= REST {
                return Ok(now);
            }
            if started.elapsed() > limit {
                return Err(format!(
                    "the controller did not come to rest within {limit:?} ({now} reconciles)"
                ));
            }
        }
    }

    /// When each fleet CRD's patch was answered in `[from, to)`, after `from`, from the
    /// controller's log ("patched CRD", logged as the answer arrives).
    fn patches_answered(&self, from: jiff::Timestamp, to: jiff::Timestamp) -> Vec<Duration> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains("patched CRD") && line.contains(GROUP))
            .filter_map(|line| line.split_whitespace().next()?.parse::<jiff::Timestamp>().ok())
            .filter(|at| *at >= from && *at < to)
            .map(|at| Duration::try_from(at.duration_since(from)).unwrap_or_default())
            .collect()
    }

    /// Why each reconcile ran (kube-runtime's reason), counted from the log.
    fn reasons(&self) -> BTreeMap<String, u64> {
        let mut reasons = BTreeMap::new();
        for line in std::fs::read_to_string(&self.log).unwrap_or_default().lines() {
            if !line.contains("reconcile started") {
                continue;
            }
            let Some(rest) = line.split("object.reason=").nth(1) else {
                continue;
            };
            let reason = rest.split('}').next().unwrap_or_default();
            // "related object updated: <ref>" names the object: keep its kind.
            let reason = match reason.split_once(": ") {
                Some((what, object)) => format!("{what}: {}", object.split('.').next().unwrap_or_default()),
                None => reason.to_owned(),
            };
            *reasons.entry(reason).or_default() += 1;
        }
        reasons
    }
}

/// One burst: when the last patch was answered, and seen by the watch, after its instant.
struct Burst {
    answered: Vec<Duration>,
    seen: Vec<Duration>,
}

impl Burst {
    fn worst(&self) -> (Duration, Duration) {
        let last = |all: &[Duration]| all.iter().copied().max().unwrap_or_default();
        (last(&self.answered), last(&self.seen))
    }
}

pub async fn run(cluster: &Cluster) -> Result<Vec<Figure>, String> {
    let n: usize = std::env::var("BENCH_POLICIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000);
    println!();
    println!("fleet: {n} policies whose introduce falls in the same second, crd-lifecycle run");
    cluster.install_policy_crd().await?;
    let created = Instant::now();
    let crds = (0..n)
        .map(|i| {
            crd(
                GROUP,
                &format!("widgets{i}"),
                &format!("Widget{i}"),
                &[("v1", true, true), ("v2", false, false), ("v3", false, false)],
            )
        })
        .collect();
    cluster.create_crds(crds, 16).await?;
    println!(
        "  {n} CRDs created and established in {:.1}s",
        created.elapsed().as_secs_f64()
    );

    // The raw client, from cold: four passes.
    let landings = Landings::default();
    let watch = landings.watch(cluster.client.clone());
    landings
        .wait(
            n,
            "v2",
            false,
            jiff::Timestamp::UNIX_EPOCH,
            Duration::from_secs(60),
        )
        .await?;
    let mut raw = Vec::new();
    for serving in [true, false, true, false] {
        let since = jiff::Timestamp::now();
        let answered = raw_patches(cluster, n, serving).await?;
        let seen = landings
            .wait(n, "v2", serving, since, Duration::from_secs(300))
            .await?;
        raw.push(Burst { answered, seen });
    }
    // Each side's mean over its bursts (the last patch of each): a best of four raw passes
    // against a best of two bursts would favour the side with more samples.
    let mean = |bursts: &[Burst]| {
        let worst: Vec<(Duration, Duration)> = bursts.iter().map(Burst::worst).collect();
        let count = u32::try_from(worst.len().max(1)).unwrap_or(1);
        let sum =
            |pick: fn(&(Duration, Duration)) -> Duration| worst.iter().map(pick).sum::<Duration>() / count;
        (sum(|w| w.0), sum(|w| w.1))
    };
    let list = |bursts: &[Burst]| {
        bursts
            .iter()
            .map(|b| format!("{:.2?}/{:.2?}", b.worst().0, b.worst().1))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (raw_answered, raw_seen) = mean(&raw);
    println!(
        "  raw client: {n} CRD patches (all at once), the last answered/seen by the watch after {} (mean {raw_answered:.2?}/{raw_seen:.2?})",
        list(&raw)
    );

    let controller = Controller::start(cluster)?;
    controller.wait_ready().await?;
    let idle = controller.wait_rest(Duration::from_secs(120)).await?;

    // v2 at T1 for every policy, far enough ahead for all of them to be created and at rest
    // before it; v3 at T2, far enough after T1 for the first burst to come to rest.
    let lead = std::env::var("BENCH_FLEET_LEAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60 + n as i64 / 10);
    let gap = 40 + n as i64 / 20;
    let now = jiff::Timestamp::now().as_second();
    let instant = |at: i64| jiff::Timestamp::from_second(at).map_err(|e| e.to_string());
    let (t1, t2) = (instant(now + lead)?, instant(now + lead + gap)?);
    let creating = Instant::now();
    create_policies(cluster, n, t1, t2).await?;
    let created_in = creating.elapsed();
    let at_rest = controller
        .wait_rest(Duration::from_secs(lead as u64))
        .await
        .map_err(|e| format!("{e}; before the policies' instant (raise BENCH_FLEET_LEAD_SECS)"))?;
    if jiff::Timestamp::now() >= t1 {
        return Err(
            "the policies were not at rest before their instant (raise BENCH_FLEET_LEAD_SECS)".into(),
        );
    }
    let creation = at_rest - idle;
    println!(
        "  {n} policies created in {:.1}s; {creation} reconciles until rest ({:.1} per policy): {:?}",
        created_in.as_secs_f64(),
        creation as f64 / n as f64,
        controller.reasons()
    );

    let limit = Duration::from_secs(lead as u64 + gap as u64 + 600);
    let seen = landings.wait(n, "v2", true, t1, limit).await?;
    let first = Burst {
        answered: controller.patches_answered(t1, t2),
        seen,
    };
    let rested = controller.wait_rest(Duration::from_secs(300)).await?;
    if jiff::Timestamp::now() >= t2 {
        return Err("the first burst was not at rest before the second (raise BENCH_FLEET_LEAD_SECS)".into());
    }
    let reconciles = rested - idle;
    let reasons = controller.reasons();
    let seen = landings.wait(n, "v3", true, t2, limit).await?;
    let second = Burst {
        answered: controller.patches_answered(t2, jiff::Timestamp::MAX),
        seen,
    };
    controller.wait_rest(Duration::from_secs(300)).await?;
    watch.abort();
    for (burst, instant) in [(&first, "T1"), (&second, "T2")] {
        if burst.answered.len() != n {
            return Err(format!(
                "the controller's log shows {} patched CRDs after {instant}, of {n}",
                burst.answered.len()
            ));
        }
        let mut answered = burst.answered.clone();
        answered.sort();
        println!(
            "  after {instant}: the controller's patches answered p50 {:.2?}, p95 {:.2?}, last {:.2?}; seen by the watch p50 {:.2?}, last {:.2?}",
            percentile(&answered, 0.5),
            percentile(&answered, 0.95),
            burst.worst().0,
            percentile(
                &{
                    let mut seen = burst.seen.clone();
                    seen.sort();
                    seen
                },
                0.5
            ),
            burst.worst().1,
        );
    }
    let bursts = [first, second];
    let (answered, seen) = mean(&bursts);
    println!(
        "  reconciles from creation to rest after T1: {reconciles} ({:.2} per policy): {reasons:?}",
        reconciles as f64 / n as f64
    );
    let ratio = answered.as_secs_f64() / raw_answered.as_secs_f64();
    let ratio_seen = seen.as_secs_f64() / raw_seen.as_secs_f64();
    let per_policy = reconciles as f64 / n as f64;
    Ok(vec![
        Figure {
            name: format!("fleet {n}: last patch answered / raw client's (means)"),
            value: format!("{ratio:.2}x ({answered:.1?})"),
            target: "≤ 1.20x".into(),
            met: Some(ratio <= 1.2),
        },
        Figure {
            name: format!("fleet {n}: last patch seen by a watch / raw (means)"),
            value: format!("{ratio_seen:.2}x ({seen:.1?})"),
            target: String::new(),
            met: None,
        },
        Figure {
            name: format!("fleet {n}: reconciles per policy, creation to rest"),
            value: format!("{per_policy:.2}"),
            target: "≤ 3".into(),
            met: Some(per_policy <= 3.0),
        },
    ])
}

/// N JSON patches setting v2's `served`, all at once, from a new client (no connection
/// open yet); when each was answered.
async fn raw_patches(cluster: &Cluster, n: usize, served: bool) -> Result<Vec<Duration>, String> {
    let api: Api<CustomResourceDefinition> = Api::all(cluster.new_client().await?);
    let started = Instant::now();
    let results: Vec<Result<Duration, String>> = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let patch = json!([{"op": "replace", "path": "/spec/versions/1/served", "value": served}]);
                let patch: json_patch::Patch = serde_json::from_value(patch).map_err(|e| e.to_string())?;
                api.patch(
                    &format!("widgets{i}.{GROUP}"),
                    &PatchParams::default(),
                    &Patch::Json::<()>(patch),
                )
                .await
                .map(|_| started.elapsed())
                .map_err(|e| format!("raw patch {i}: {e}"))
            }
        })
        .buffer_unordered(n.max(1))
        .collect()
        .await;
    results.into_iter().collect()
}

async fn create_policies(
    cluster: &Cluster,
    n: usize,
    t1: jiff::Timestamp,
    t2: jiff::Timestamp,
) -> Result<(), String> {
    let (t1, t2) = (t1.to_string(), t2.to_string());
    let results: Vec<Result<(), String>> = futures::stream::iter(0..n)
        .map(|i| {
            let (t1, t2) = (t1.clone(), t2.clone());
            async move {
                let policy = json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
                    "metadata": {"name": format!("fleet{i}")},
                    "spec": {"crdName": format!("widgets{i}.{GROUP}"),
                             "versions": [{"name": "v1"}, {"name": "v2", "introduce": {"at": t1}},
                                          {"name": "v3", "introduce": {"at": t2}}],
                             "migration": {"enabled": false}}});
                cluster
                    .create("/apis/crdlifecycle.io/v1alpha1/versionpolicies", &policy)
                    .await
                    .map_err(|e| format!("cannot create policy fleet{i}: {e}"))
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, String>>()?;
    Ok(())
}

/// When each fleet CRD was last seen to start or stop serving v2 and v3, from one CRD watch
/// that runs for the raw client and the controller alike (the same observer for both).
#[derive(Clone, Default)]
struct Landings {
    by_version: Arc<Mutex<ServedSince>>,
}

/// Per (CRD, version): whether it is served, and since when it was seen so.
type ServedSince = HashMap<(String, String), (bool, jiff::Timestamp)>;

impl Landings {
    /// Watches the fleet's CRDs until aborted.
    fn watch(&self, client: kube::Client) -> tokio::task::JoinHandle<()> {
        let by_version = self.by_version.clone();
        tokio::spawn(async move {
            let api: Api<CustomResourceDefinition> = Api::all(client);
            let mut events = std::pin::pin!(
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
            );
            while let Some(event) = events.next().await {
                let Ok(crd) = event else { continue };
                if crd.spec.group != GROUP {
                    continue;
                }
                let now = jiff::Timestamp::now();
                let name = crd.metadata.name.clone().unwrap_or_default();
                let mut by_version = by_version.lock().expect("lock");
                for version in crd.spec.versions.iter().filter(|v| v.name != "v1") {
                    let entry = by_version
                        .entry((name.clone(), version.name.clone()))
                        .or_insert((version.served, now));
                    if entry.0 != version.served {
                        *entry = (version.served, now);
                    }
                }
            }
        })
    }

    /// Waits until all `n` CRDs were seen serving `version` (or not) since `since`; how long
    /// after `since` each one was.
    async fn wait(
        &self,
        n: usize,
        version: &str,
        serving: bool,
        since: jiff::Timestamp,
        limit: Duration,
    ) -> Result<Vec<Duration>, String> {
        let started = Instant::now();
        loop {
            let landed: Vec<Duration> = self
                .by_version
                .lock()
                .expect("lock")
                .iter()
                .filter(|((_, v), (serves, at))| v == version && *serves == serving && *at >= since)
                .map(|(_, (_, at))| Duration::try_from(at.duration_since(since)).unwrap_or_default())
                .collect();
            if landed.len() >= n {
                return Ok(landed);
            }
            if started.elapsed() > limit {
                return Err(format!(
                    "only {} of {n} CRDs {} {version} within {limit:?}",
                    landed.len(),
                    if serving { "serve" } else { "stopped serving" }
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
