//! Fleet scale: `cargo bench --bench fleet`.
//!
//! N policies (default 1,000, `BENCH_POLICIES`), each governing its own CRD, all with an
//! `introduce` due at the same instant, reconciled by the controller's `reconcile` against
//! the in-process fake apiserver (`tests/support/apiserver`), at most `BENCH_CONCURRENCY`
//! at once (default 32). Prints how late each CRD patch landed after the instant (p50, p95,
//! p99, max), the same number of plain CRD patches sent by a raw client with the same
//! concurrency, the ratio, and this process's peak memory (the fake's objects included),
//! so that regressions in the controller's per-policy cost show.

#[path = "../tests/support/apiserver/mod.rs"]
mod apiserver;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apiserver::FakeApiserver;
use crd_lifecycle::api::VersionPolicy;
use crd_lifecycle::controller::metrics::Metrics;
use crd_lifecycle::controller::migrations::Migrations;
use crd_lifecycle::controller::traffic::TrafficMonitor;
use crd_lifecycle::controller::{Context, reconcile};
use futures::StreamExt;
use kube::core::DeserializeGuard;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::watcher;
use serde_json::{Value, json};

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

fn crd(i: usize) -> Value {
    let version = |name: &str, served: bool, storage: bool| {
        json!({"name": name, "served": served, "storage": storage,
               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
    };
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": format!("widgets{i}.example.com")},
           "spec": {"group": "example.com", "names": {"kind": format!("Widget{i}"), "plural": format!("widgets{i}")},
                    "scope": "Namespaced", "versions": [version("v1", true, true), version("v2", false, false)]},
           "status": {"storedVersions": ["v1"]}})
}

fn policy(i: usize, at: &str) -> Value {
    json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
           "metadata": {"name": format!("p{i}"), "uid": format!("uid-{i}"), "generation": 1,
                        "creationTimestamp": "2026-01-01T00:00:00Z"},
           "spec": {"crdName": format!("widgets{i}.example.com"),
                    "versions": [{"name": "v1"}, {"name": "v2", "introduce": {"at": at}}],
                    "migration": {"enabled": false}}})
}

fn peak_memory_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

async fn run() {
    let n = env("BENCH_POLICIES", 1000);
    let concurrency = env("BENCH_CONCURRENCY", 32);
    let fake = FakeApiserver::new();
    for i in 0..n {
        fake.create_crd(crd(i));
    }
    let instant = jiff::Timestamp::now();
    let at = instant.to_string();
    for i in 0..n {
        fake.create_policy(policy(i, &at));
    }
    let client = fake.client();
    let (store, mut writer) = reflector::store::<DeserializeGuard<VersionPolicy>>();
    let policies: Vec<DeserializeGuard<VersionPolicy>> = fake
        .lock()
        .policies
        .values()
        .map(|p| serde_json::from_value(p.clone()).expect("decodes"))
        .collect();
    writer.apply_watcher_event(&watcher::Event::Init);
    for policy in &policies {
        writer.apply_watcher_event(&watcher::Event::InitApply(policy.clone()));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "crd-lifecycle".into(),
            instance: Some("bench".into()),
        },
    );
    let metrics = Arc::new(Metrics::default());
    let context = Arc::new(Context {
        traffic: TrafficMonitor::new(client.clone(), Duration::from_secs(3600)),
        migrations: Arc::new(Migrations::new(
            client.clone(),
            recorder.clone(),
            metrics.clone(),
            2,
        )),
        client: client.clone(),
        recorder,
        metrics,
        policies: store,
        clock: Arc::new(jiff::Timestamp::now),
        resync: Duration::from_secs(600),
        webhook: None,
    });

    // Every policy is due now: reconcile them all, as the controller's queue would.
    let started = Instant::now();
    let landed: Arc<Mutex<Vec<Duration>>> = Arc::default();
    futures::stream::iter(policies)
        .map(|policy| {
            let context = context.clone();
            let landed = landed.clone();
            async move {
                reconcile(Arc::new(policy), context).await.expect("reconciles");
                landed.lock().expect("lock").push(started.elapsed());
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<()>>()
        .await;
    let controller_total = started.elapsed();
    let patched = fake.crd_writes().len();
    assert!(patched >= n, "{patched} CRD patches for {n} policies");
    let mut late = landed.lock().expect("lock").clone();
    late.sort();

    // The same number of CRD patches from a raw client, same concurrency.
    let crds: kube::Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = kube::Api::all(client.clone());
    let raw_started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let crds = crds.clone();
            async move {
                let patch = json!([{"op": "replace", "path": "/spec/versions/1/served", "value": false}]);
                let patch: json_patch::Patch = serde_json::from_value(patch).expect("patch");
                crds.patch(
                    &format!("widgets{i}.example.com"),
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::<()>::Json(patch),
                )
                .await
                .expect("raw patch");
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<()>>()
        .await;
    let raw_total = raw_started.elapsed();

    println!(
        "{n} policies due at the same instant, {concurrency} reconciles at once, in-process fake apiserver"
    );
    println!(
        "landed after the instant: p50 {:.0?}, p95 {:.0?}, p99 {:.0?}, max {:.0?}",
        percentile(&late, 0.5),
        percentile(&late, 0.95),
        percentile(&late, 0.99),
        late[late.len() - 1]
    );
    println!(
        "all {n} landed in {:.0?}; a raw client's {n} CRD patches took {:.0?} ({:.1}x)",
        controller_total,
        raw_total,
        controller_total.as_secs_f64() / raw_total.as_secs_f64()
    );
    println!(
        "peak memory of this process (fake apiserver included): {:.1} MB",
        peak_memory_mb()
    );
}
