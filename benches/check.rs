//! `check` on a big cluster against `kubectl get`: `KUBEBUILDER_ASSETS=/path cargo bench --bench check`.
//!
//! Starts a real control plane from `KUBEBUILDER_ASSETS` (the e2e suite's harness,
//! `tests/e2e/control_plane.rs`), creates `BENCH_CRDS` CRDs (default 200) holding
//! `BENCH_OBJECTS` objects in all (default 50,000), each CRD with objects stored as v1beta1
//! and its storage moved to v1, then times:
//! - `kubectl get <crd> -A --chunk-size=500 -o name` for every CRD, one after another (what
//!   a person or a script does to page through the same objects), after one warm-up call
//!   that fills kubectl's discovery cache;
//! - `crd-lifecycle check -f <release>` of a release whose CRDs all drop v1beta1 (the
//!   Flux-like upgrade): a metadata-only list of every object (managedFields, count), so the
//!   fair comparison is kubectl's own paging of the same objects, which reads more (whole
//!   objects) per page. Neither needs bodies beyond that.
//!
//! - the same pages of whole objects read by one in-process client, one CRD after another:
//!   the paging alone, without kubectl's process start and discovery per CRD.
//!
//! Prints each, the ratio and the target (check ≤ 1.2 × kubectl). Without
//! `KUBEBUILDER_ASSETS` it prints one line and exits.

#[path = "../tests/e2e/control_plane.rs"]
#[allow(dead_code)]
mod control_plane;

use std::process::Command;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn version(name: &str, served: bool, storage: bool) -> Value {
    json!({"name": name, "served": served, "storage": storage,
           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
               "spec": {"type": "object", "properties": {"size": {"type": "integer"}, "color": {"type": "string"}}}}}}})
}

fn crd(index: usize, versions: Vec<Value>) -> Value {
    let group = format!("g{index:03}.bench.crdlifecycle.test");
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": format!("widgets.{group}")},
           "spec": {"group": group, "scope": "Cluster", "versions": versions,
                    "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"}}})
}

fn main() {
    let Some(assets) = control_plane::assets() else {
        println!("check bench: SKIPPED: set KUBEBUILDER_ASSETS to a directory with etcd and kube-apiserver");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    if let Err(error) = runtime.block_on(bench(assets)) {
        eprintln!("check bench failed: {error}");
        std::process::exit(1);
    }
}

async fn bench(assets: std::path::PathBuf) -> Result<(), String> {
    let crds = number("BENCH_CRDS", 200);
    let objects = number("BENCH_OBJECTS", 50_000);
    let per_crd = objects.div_ceil(crds);
    let plane = control_plane::ControlPlane::start(&assets).await?;
    let client = plane.client().await?;
    let info = client.apiserver_version().await.map_err(|e| e.to_string())?;
    println!(
        "check bench: kube-apiserver {} on {} cores; {crds} CRDs × {per_crd} objects",
        info.git_version,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let started = Instant::now();
    for i in 0..crds {
        let crd: CustomResourceDefinition = serde_json::from_value(crd(
            i,
            vec![version("v1beta1", true, true), version("v1", true, false)],
        ))
        .map_err(|e| e.to_string())?;
        api.create(&PostParams::default(), &crd)
            .await
            .map_err(|e| e.to_string())?;
    }
    // Established, and served (discovery) before objects are created.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let created: Vec<Result<(), String>> = futures::stream::iter((0..crds).flat_map(|c| (0..per_crd).map(move |o| (c, o))))
        .map(|(c, o)| {
            let client = client.clone();
            async move {
                let group = format!("g{c:03}.bench.crdlifecycle.test");
                let body = json!({"apiVersion": format!("{group}/v1beta1"), "kind": "Widget",
                                  "metadata": {"name": format!("w{o:05}")}, "spec": {"size": o, "color": "blue"}});
                for attempt in 0..5 {
                    let request = http::Request::post(format!("/apis/{group}/v1beta1/widgets"))
                        .header("content-type", "application/json")
                        .body(serde_json::to_vec(&body).unwrap_or_default())
                        .map_err(|e| e.to_string())?;
                    match client.request::<Value>(request).await {
                        Ok(_) => return Ok(()),
                        Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
                        Err(error) if attempt == 4 => return Err(error.to_string()),
                        Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                    }
                }
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    created.into_iter().collect::<Result<Vec<()>, String>>()?;
    // The storage moves to v1: storedVersions [v1beta1, v1].
    for i in 0..crds {
        let name = format!("widgets.g{i:03}.bench.crdlifecycle.test");
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "replace", "path": "/spec/versions/0/storage", "value": false},
            {"op": "replace", "path": "/spec/versions/1/storage", "value": true},
        ]))
        .map_err(|e| e.to_string())?;
        api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .map_err(|e| e.to_string())?;
    }
    println!(
        "check bench: {} objects created in {:.0}s",
        crds * per_crd,
        started.elapsed().as_secs_f64()
    );

    // The release: every CRD without v1beta1.
    let release = std::env::temp_dir().join(format!("crd-lifecycle-check-bench-{}.yaml", std::process::id()));
    let documents: Vec<String> = (0..crds)
        .map(|i| crd(i, vec![version("v1", true, true)]).to_string())
        .collect();
    std::fs::write(&release, documents.join("\n---\n")).map_err(|e| e.to_string())?;

    let kubectl = |args: &[String]| {
        Command::new("kubectl")
            .env("KUBECONFIG", &plane.kubeconfig)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run kubectl: {e}"))
    };
    kubectl(&["api-resources".to_owned()])?;
    let started = Instant::now();
    for i in 0..crds {
        let output = kubectl(&[
            "get".to_owned(),
            format!("widgets.g{i:03}.bench.crdlifecycle.test"),
            "-A".to_owned(),
            "--chunk-size=500".to_owned(),
            "-o".to_owned(),
            "name".to_owned(),
        ])?;
        if !output.status.success() {
            return Err(format!(
                "kubectl get failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
    }
    let kubectl_time = started.elapsed().as_secs_f64();

    // The paging alone, without kubectl's process start and discovery: one client, the
    // same pages of whole objects, one CRD after another.
    let started = Instant::now();
    for i in 0..crds {
        let group = format!("g{i:03}.bench.crdlifecycle.test");
        let resource = kube::discovery::ApiResource {
            group: group.clone(),
            version: "v1".into(),
            api_version: format!("{group}/v1"),
            kind: "Widget".into(),
            plural: "widgets".into(),
        };
        let api: Api<kube::core::DynamicObject> = Api::all_with(client.clone(), &resource);
        let mut token: Option<String> = None;
        loop {
            let mut params = kube::api::ListParams::default().limit(500);
            if let Some(token) = &token {
                params = params.continue_token(token);
            }
            let page = api.list(&params).await.map_err(|e| e.to_string())?;
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                break;
            }
        }
    }
    let raw_time = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"))
        .env("KUBECONFIG", &plane.kubeconfig)
        .args(["check", "-o", "json", "-f"])
        .arg(&release)
        .output()
        .map_err(|e| e.to_string())?;
    let check_time = started.elapsed().as_secs_f64();
    let report: Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&output.stderr)))?;
    let rejected = report["summary"]["rejected"].as_u64().unwrap_or(0);
    if output.status.code() != Some(1) || rejected != crds as u64 {
        return Err(format!(
            "check should find every CRD rejected (exit 1): exit {:?}, {rejected} rejected",
            output.status.code()
        ));
    }
    let _ = std::fs::remove_file(&release);
    let ratio = check_time / kubectl_time;
    println!("| reader | CRDs | objects | seconds | vs kubectl | target |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| kubectl get -A --chunk-size=500 -o name, each CRD | {crds} | {} | {kubectl_time:.1} | | |",
        crds * per_crd
    );
    println!(
        "| one client paging the same whole objects, each CRD | {crds} | {} | {raw_time:.1} | {:.2}× | |",
        crds * per_crd,
        raw_time / kubectl_time
    );
    println!(
        "| crd-lifecycle check (metadata pages) | {crds} | {} | {check_time:.1} | {ratio:.2}× | ≤ 1.20× {} |",
        crds * per_crd,
        if ratio <= 1.2 { "met" } else { "MISSED" }
    );
    plane.stop();
    Ok(())
}
