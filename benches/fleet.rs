//! Fleet scale: `cargo bench --bench fleet`.
//!
//! N policies (default 1,000, `BENCH_POLICIES`), each governing its own CRD, all with an
//! `introduce` due at the same instant, reconciled by the controller's `reconcile` against
//! the in-process fake apiserver (`tests/support/apiserver`), at most `BENCH_CONCURRENCY`
//! at once (default 32). Prints how late each CRD patch landed after the instant (p50, p95,
//! p99, max), the same number of plain CRD patches sent by a raw client with the same
//! concurrency, the ratio, and this process's peak memory (the fake's objects included),
//! so that regressions in the controller's per-policy cost show. A counting allocator also
//! gives the heap the controller's own state holds after the run (its policy cache, event
//! recorder cache, metrics and migration bookkeeping), per policy: what grows with the fleet.

#[path = "../tests/support/apiserver/mod.rs"]
mod apiserver;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apiserver::FakeApiserver;
use crd_lifecycle::api::VersionPolicy;
use crd_lifecycle::controller::metrics::Metrics;
use crd_lifecycle::controller::traffic::TrafficMonitor;
use crd_lifecycle::controller::{Context, reconcile};
use futures::StreamExt;
use kube::core::DeserializeGuard;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::watcher;
use serde_json::{Value, json};

/// The system allocator, counting the bytes live on the heap.
struct Counting;

static LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is kept.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: forwarded as given.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: forwarded as given.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, std::sync::atomic::Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: forwarded as given.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> usize {
    LIVE.load(std::sync::atomic::Ordering::Relaxed)
}

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
    let context = Arc::new(
        Context::builder(client.clone(), store)
            .recorder(recorder)
            .metrics(metrics)
            .traffic(TrafficMonitor::new(client.clone(), Duration::from_secs(3600)))
            .build(),
    );

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
    // What the controller itself keeps: its state, dropped after the run.
    let with_controller = live_bytes();
    drop(context);
    drop(writer);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let retained = with_controller.saturating_sub(live_bytes());
    println!(
        "heap held by the controller's state after the run: {:.1} MB ({:.1} KB per policy)",
        retained as f64 / 1e6,
        retained as f64 / 1e3 / n as f64
    );
}
