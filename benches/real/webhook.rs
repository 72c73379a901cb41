//! The conversion webhook through the real apiserver: `crd-lifecycle webhook` against a
//! minimal webhook on the same HTTP and TLS stack that only rewrites `apiVersion`
//! (`benches/support/floor_webhook.rs`).
//!
//! A CRD with versions v1 (storage) and v2, objects stored as v1; every read goes through v2,
//! so the apiserver sends one ConversionReview per object (apiserver-samples/32). The CRD's
//! `spec.conversion` points at each webhook in turn, in alternating rounds.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::Figure;
use crate::cluster::{Cluster, crd, percentile};
use crate::control_plane::free_port;

const GROUP: &str = "webhook.bench.example.com";
const PLURAL: &str = "gadgets";
const KIND: &str = "Gadget";
const NAMESPACES: usize = 10;
const GETS: usize = 200;
const LISTS: usize = 5;

/// A webhook as a child process.
struct Webhook {
    label: &'static str,
    child: Child,
    url: String,
    ca_pem: String,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Webhook {
    fn spawn(
        label: &'static str,
        dir: &std::path::Path,
        path: &str,
        command: impl FnOnce(u16, &str) -> Command,
    ) -> Result<Webhook, String> {
        let port = free_port()?;
        let ca = dir.join(format!("ca-{port}.pem")).display().to_string();
        let child = command(port, &ca)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the {label} webhook: {e}"))?;
        let started = Instant::now();
        while !(std::fs::metadata(&ca).is_ok() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()) {
            if started.elapsed() > Duration::from_secs(20) {
                return Err(format!("the {label} webhook did not listen within 20 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let ca_pem = std::fs::read_to_string(&ca).map_err(|e| e.to_string())?;
        Ok(Webhook {
            label,
            child,
            url: format!("https://127.0.0.1:{port}{path}"),
            ca_pem,
        })
    }
}

/// Latencies of one round through one webhook.
#[derive(Default)]
struct Round {
    gets: Vec<Duration>,
    lists: Vec<Duration>,
}

pub async fn run(cluster: &Cluster) -> Result<Vec<Figure>, String> {
    let objects: usize = std::env::var("BENCH_WEBHOOK_OBJECTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5_000);
    let rounds: usize = std::env::var("BENCH_WEBHOOK_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    println!();
    println!(
        "webhook: crd-lifecycle webhook vs a minimal webhook (same HTTP/TLS stack, only rewrites apiVersion), through the apiserver; {objects} objects, {rounds} rounds"
    );
    let name = format!("{PLURAL}.{GROUP}");
    cluster.create_namespaces(NAMESPACES).await?;
    cluster
        .create_crds(
            vec![crd(
                GROUP,
                PLURAL,
                KIND,
                &[("v1", true, true), ("v2", true, false)],
            )],
            1,
        )
        .await?;
    cluster
        .create_objects(GROUP, "v1", PLURAL, KIND, objects, NAMESPACES)
        .await?;

    let dir = std::env::temp_dir().join(format!("crd-lifecycle-bench-real-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        format!(
            "apiVersion: crdlifecycle.io/v1alpha1\nkind: VersionPolicy\nmetadata: {{name: bench}}\nspec:\n  crdName: {name}\n  versions: [{{name: v1}}, {{name: v2}}]\n  conversion:\n    webhook: {{enabled: true}}\n    changes: [{{from: v1, to: v2}}]\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let ours = Webhook::spawn("crd-lifecycle", &dir, "/convert/bench", |port, ca| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"));
        command.args(["webhook", "--policy"]).arg(&policy).args([
            "--port",
            &port.to_string(),
            "--name",
            "127.0.0.1",
            "--ca-out",
            ca,
        ]);
        command
    })?;
    let floor = Webhook::spawn("minimal", &dir, "/convert/bench", |port, ca| {
        let mut command = Command::new(std::env::current_exe().expect("own path"));
        command.args(["--floor", &port.to_string(), ca]);
        command
    })?;

    let mut results: Vec<(&'static str, Round)> = Vec::new();
    for _ in 0..rounds {
        for webhook in [&floor, &ours] {
            point_at(cluster, &name, webhook).await?;
            let round = measure(cluster, objects).await?;
            println!(
                "  {:<14} GET p50 {:>7.2?} p99 {:>7.2?} total {:>7.2?}   LIST of {objects} p50 {:>7.2?}",
                webhook.label,
                percentile(&sorted(&round.gets), 0.5),
                percentile(&sorted(&round.gets), 0.99),
                round.gets.iter().sum::<Duration>(),
                percentile(&sorted(&round.lists), 0.5),
            );
            results.push((webhook.label, round));
        }
    }
    let total = |label: &str, pick: fn(&Round) -> &Vec<Duration>| -> Duration {
        results
            .iter()
            .filter(|(l, _)| *l == label)
            .flat_map(|(_, r)| pick(r).iter())
            .sum()
    };
    let gets = total(ours.label, |r| &r.gets).as_secs_f64() / total(floor.label, |r| &r.gets).as_secs_f64();
    let lists =
        total(ours.label, |r| &r.lists).as_secs_f64() / total(floor.label, |r| &r.lists).as_secs_f64();
    Ok(vec![
        Figure {
            name: format!("webhook: {GETS} single GETs, ours / minimal"),
            value: format!("{gets:.2}x"),
            target: "≤ 1.00x".into(),
            met: Some(gets <= 1.0),
        },
        Figure {
            name: format!("webhook: LIST of {objects}, ours / minimal"),
            value: format!("{lists:.2}x"),
            target: "≤ 1.00x".into(),
            met: Some(lists <= 1.0),
        },
    ])
}

fn sorted(latencies: &[Duration]) -> Vec<Duration> {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    sorted
}

/// Points the CRD's conversion at `webhook` and waits until reads through v2 work.
async fn point_at(cluster: &Cluster, name: &str, webhook: &Webhook) -> Result<(), String> {
    let api: Api<CustomResourceDefinition> = Api::all(cluster.client.clone());
    let bundle = base64::engine::general_purpose::STANDARD.encode(&webhook.ca_pem);
    let patch = json!({"spec": {"conversion": {"strategy": "Webhook", "webhook": {
        "conversionReviewVersions": ["v1"],
        "clientConfig": {"url": webhook.url, "caBundle": bundle}}}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| format!("cannot point {name} at the {} webhook: {e}", webhook.label))?;
    // The apiserver swaps the CRD's handler on its own watch: give it time, then warm up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in 0..20 {
        get(cluster, i).await?;
    }
    Ok(())
}

/// One GET through v2 (converted by the webhook).
async fn get(cluster: &Cluster, i: usize) -> Result<Duration, String> {
    let namespace = format!("ns{}", i % NAMESPACES);
    let request = http::Request::get(format!(
        "/apis/{GROUP}/v2/namespaces/{namespace}/{PLURAL}/w{i:06}"
    ))
    .body(Vec::new())
    .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let object: Value = cluster
        .client
        .request(request)
        .await
        .map_err(|e| format!("GET w{i:06} through v2: {e}"))?;
    let took = started.elapsed();
    if object["apiVersion"] != format!("{GROUP}/v2") {
        return Err(format!("GET through v2 answered {}", object["apiVersion"]));
    }
    Ok(took)
}

async fn measure(cluster: &Cluster, objects: usize) -> Result<Round, String> {
    let mut round = Round::default();
    for i in 0..GETS {
        round.gets.push(get(cluster, (i * 7919) % objects).await?);
    }
    for _ in 0..LISTS {
        let request = http::Request::get(format!("/apis/{GROUP}/v2/{PLURAL}"))
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let list: Value = cluster
            .client
            .request(request)
            .await
            .map_err(|e| format!("LIST through v2: {e}"))?;
        round.lists.push(started.elapsed());
        let items = list["items"].as_array().map_or(0, Vec::len);
        if items != objects {
            return Err(format!("LIST through v2 answered {items} objects of {objects}"));
        }
    }
    Ok(round)
}
