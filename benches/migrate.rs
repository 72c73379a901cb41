//! Migrator throughput and memory: `cargo bench --bench migrate`.
//!
//! Runs the migrator against an in-process HTTP API on 127.0.0.1 that serves N objects
//! (generated on the fly, so the server's own memory does not grow with N), next to a raw
//! client issuing the same requests (paged metadata lists, one merge patch per object) with
//! the same concurrency and no bookkeeping. Each run is a child process, so that its peak
//! memory (VmHWM) is its own. Prints objects/s, peak memory and the migrator/raw ratio.
//!
//! A third run, `migrator, tokens expiring`, answers every continue token older than
//! `BENCH_COMPACT_SECS` (default 1) with 410 and a fresh token, as the apiserver does after an
//! etcd compaction (samples 27, 28): the run must finish at about the same rate, with flat
//! memory.
//!
//! Every migrator run uses the production settle check. `migrator` and `expiring` migrate a
//! CRD last changed ten minutes ago (its managedFields time): one discovery answer confirms
//! it, so the figure is the whole run, settle check included. `just switched` migrates a CRD
//! changed a moment ago: the 4 s of confirmations in a row run while the first page is
//! listed, and only then do the writes start (that wait is the safety margin for an HA
//! control plane, docs/src/internals/architecture.md).
//!
//! `BENCH_SIZES=1000,5000 cargo bench --bench migrate` picks other sizes;
//! `BENCH_LATENCY_MS=30` makes the API answer every request that much later, as a real
//! apiserver does (about 30 ms a rewrite: 5,000 objects in 10 s at concurrency 16), so that
//! fixed costs (the settle check, the CRD reads, the permission checks) weigh what they
//! weigh there.

#[path = "support/raw_client.rs"]
mod raw_client;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, patch};
use crd_lifecycle::migrate::{self, Settings, SettleCheck};
use serde_json::{Value, json};

const CONCURRENCY: usize = 16;
const PAGE_SIZE: u32 = 500;
const NAMESPACES: u64 = 10;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(position) = args.iter().position(|a| a == "--child") {
        let mode = args.get(position + 1).cloned().unwrap_or_default();
        let objects: u64 = args
            .get(position + 2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(1000);
        child(&mode, objects);
        return;
    }
    let sizes: Vec<u64> = std::env::var("BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![5_000, 10_000, 100_000]);
    let exe = std::env::current_exe().expect("own path");
    println!(
        "migrator vs raw client, concurrency {CONCURRENCY}, page size {PAGE_SIZE}, in-process HTTP API on loopback"
    );
    println!(
        "{:>9}  {:>25}  {:>10}  {:>14}  {:>9}",
        "objects", "client", "objects/s", "peak memory", "vs raw"
    );
    for objects in sizes {
        let mut raw_rate = None;
        for mode in ["raw", "migrator", "just-switched", "expiring"] {
            let output = Command::new(&exe)
                .args(["--child", mode, &objects.to_string()])
                .output()
                .expect("child runs");
            let text = String::from_utf8_lossy(&output.stdout);
            let Some(line) = text.lines().find(|l| l.starts_with("result ")) else {
                eprintln!(
                    "{mode} {objects}: no result\n{text}\n{}",
                    String::from_utf8_lossy(&output.stderr)
                );
                std::process::exit(1);
            };
            let field = |name: &str| -> f64 {
                line.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            };
            let rate = field("objects") / field("seconds").max(1e-9);
            let ratio = match (mode, raw_rate) {
                ("raw", _) | (_, None) => String::from("-"),
                (_, Some(raw)) => format!("{:.0}%", 100.0 * rate / raw),
            };
            let expired = match field("expired") {
                0.0 => String::new(),
                n => format!("  ({n:.0} expired tokens followed)"),
            };
            let label = match mode {
                "expiring" => "migrator, tokens expiring",
                "just-switched" => "migrator, just switched",
                other => other,
            };
            if mode == "raw" {
                raw_rate = Some(rate);
            }
            println!(
                "{objects:>9}  {label:>25}  {rate:>10.0}  {:>10.1} MiB  {ratio:>9}{expired}",
                field("peak_kib") / 1024.0
            );
        }
    }
}

/// One measured run in this (child) process.
fn child(mode: &str, objects: u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let compact_every = match mode {
        "expiring" => Some(Duration::from_secs_f64(
            std::env::var("BENCH_COMPACT_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1.0),
        )),
        _ => None,
    };
    runtime.block_on(async {
        let changed_ago = if mode == "just-switched" { 0 } else { 600 };
        let address = serve(objects, compact_every, changed_ago).await;
        let config = kube::Config::new(format!("http://{address}").parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let started = Instant::now();
        let (done, expired) = match mode {
            "raw" => (
                raw_client::rewrite_all(&client, "/apis/example.com/v1/widgets", PAGE_SIZE, CONCURRENCY)
                    .await
                    .objects,
                0,
            ),
            _ => {
                let settings = Settings {
                    concurrency: CONCURRENCY,
                    page_size: PAGE_SIZE,
                    settle: SettleCheck::default(),
                    ..Settings::default()
                };
                let report = migrate::migrate(&client, "widgets.example.com", &settings, &migrate::Quiet)
                    .await
                    .expect("migration runs");
                assert!(report.succeeded(), "{}", report.summary());
                (report.counts.rewritten, report.expired_tokens)
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        assert_eq!(done, objects, "every object processed exactly once");
        println!(
            "result objects={done} seconds={seconds:.3} peak_kib={} expired={expired}",
            peak_kib()
        );
    });
}

fn peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

#[derive(Clone)]
struct Api {
    objects: u64,
    trimmed: Arc<AtomicU64>,
    /// Continue tokens older than this answer 410 with a fresh token (etcd compaction).
    compact_every: Option<Duration>,
    started: Instant,
    /// The CRD's managedFields time (its last change).
    changed_at: String,
}

/// Serves the CRD and `objects` widgets (generated from their index) on a loopback port.
async fn serve(objects: u64, compact_every: Option<Duration>, changed_ago: i64) -> SocketAddr {
    let changed_at = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(changed_ago);
    let state = Api {
        objects,
        trimmed: Arc::new(AtomicU64::new(0)),
        compact_every,
        started: Instant::now(),
        changed_at: changed_at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    };
    let app = Router::new()
        .route(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
            get(crd),
        )
        .route(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}/status",
            patch(trim),
        )
        // The migrator's watch of the CRD: open, with no event (the CRD does not change).
        .route(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            get(|| async {
                axum::body::Body::from_stream(
                    futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>(),
                )
            }),
        )
        .route("/apis/example.com/v1", get(discovery))
        .route(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            axum::routing::post(access_review),
        )
        .route("/apis/example.com/v1/widgets", get(list))
        .route(
            "/apis/example.com/v1/namespaces/{ns}/widgets/{name}",
            patch(rewrite),
        )
        .layer(axum::middleware::from_fn(latency))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    address
}

async fn crd(State(api): State<Api>) -> impl IntoResponse {
    let stored = if api.trimmed.load(Ordering::Relaxed) > 0 {
        json!(["v1"])
    } else {
        json!(["v1alpha1", "v1"])
    };
    axum::Json(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com", "generation": 2, "resourceVersion": "100",
                     "managedFields": [{"manager": "kubectl", "operation": "Update",
                                        "apiVersion": "apiextensions.k8s.io/v1", "time": api.changed_at,
                                        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
        "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"}, "scope": "Namespaced",
                 "versions": [{"name": "v1alpha1", "served": true, "storage": false},
                              {"name": "v1", "served": true, "storage": true}]},
        "status": {"storedVersions": stored},
    }))
}

async fn trim(State(api): State<Api>) -> impl IntoResponse {
    api.trimmed.fetch_add(1, Ordering::Relaxed);
    crd(State(api)).await
}

/// `BENCH_LATENCY_MS` before every answer.
async fn latency(request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let millis: u64 = std::env::var("BENCH_LATENCY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if millis > 0 {
        tokio::time::sleep(Duration::from_millis(millis)).await;
    }
    next.run(request).await
}

/// Every permission the migrator checks for is granted.
async fn access_review(axum::Json(mut review): axum::Json<Value>) -> impl IntoResponse {
    review["status"] = json!({"allowed": true});
    (StatusCode::CREATED, axum::Json(review))
}

/// Discovery with the storage version's hash (samples 25, 26), so the switch is confirmed.
async fn discovery() -> impl IntoResponse {
    axum::Json(json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "example.com/v1",
        "resources": [{"name": "widgets", "singularName": "widget", "namespaced": true, "kind": "Widget",
                       "verbs": ["get", "list", "patch"],
                       "storageVersionHash": migrate::storage_version_hash("example.com", "v1", "Widget")}],
    }))
}

/// Pages of objects; a token is `<compaction epoch>:<next index>`. Full lists (the
/// migrator's count) carry `remainingItemCount`, metadata-only lists do not (sample 30).
async fn list(
    State(api): State<Api>,
    headers: HeaderMap,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> axum::response::Response {
    let epoch = api.compact_every.map_or(0, |every| {
        (api.started.elapsed().as_nanos() / every.as_nanos().max(1)) as u64
    });
    let limit: u64 = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(api.objects);
    let (issued, start) = query
        .get("continue")
        .and_then(|c| c.split_once(':'))
        .map_or((epoch, 0), |(e, i)| {
            (e.parse().unwrap_or(0), i.parse().unwrap_or(0))
        });
    if issued != epoch {
        return (
            StatusCode::GONE,
            axum::Json(
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                              "code": 410, "message": "The provided continue parameter is too old",
                              "metadata": {"continue": format!("{epoch}:{start}")}}),
            ),
        )
            .into_response();
    }
    let metadata_only = headers
        .get("accept")
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("PartialObjectMetadataList"));
    let end = (start + limit).min(api.objects);
    let items: Vec<Value> = (start..end)
        .map(|i| {
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": {"name": format!("w{i}"), "namespace": format!("ns{}", i % NAMESPACES),
                                "resourceVersion": (1000 + i).to_string()}})
        })
        .collect();
    let mut metadata = json!({"resourceVersion": "100"});
    if end < api.objects {
        metadata["continue"] = json!(format!("{epoch}:{end}"));
        if !metadata_only {
            metadata["remainingItemCount"] = json!(api.objects - end);
        }
    }
    axum::Json(
        json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                      "metadata": metadata, "items": items}),
    )
    .into_response()
}

async fn rewrite(Path((ns, name)): Path<(String, String)>) -> impl IntoResponse {
    (
        StatusCode::OK,
        axum::Json(json!({"apiVersion": "example.com/v1", "kind": "Widget",
                          "metadata": {"name": name, "namespace": ns, "resourceVersion": "2000"},
                          "spec": {"size": 1}})),
    )
}
