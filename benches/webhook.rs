//! Conversion webhook latency and memory: `cargo bench --bench webhook`.
//!
//! Starts the real server (`crd-lifecycle webhook --policy examples/conversion/policy.yaml`,
//! a child process, so its peak memory is its own) and, next to it, a minimal webhook on the
//! same TLS and HTTP/2 stack that only sets `apiVersion` (the floor). A client that speaks
//! as the apiserver does (TLS, ALPN h2, one kept-alive connection) then sends:
//!
//! - a LIST's worth of 1-object reviews, one after another (the apiserver sends one review
//!   per object, apiserver-samples/32): per-review p50/p99 and the total against the floor;
//! - 5,000-object reviews: per-review p50/p99;
//! - bombs (an expression over its cost limit) while `/healthz` is polled: how long a bomb
//!   takes to be refused, and health latency meanwhile.
//!
//! The objects are the example's v1alpha1 gadgets converted to v1: two steps, renames, an
//! added default and a CEL type change (`int(self)`). Then the same with renames only (the
//! inline path). `BENCH_OBJECTS=5000` sets the LIST size.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "support/floor_webhook.rs"]
mod floor_webhook;
#[path = "../tests/support/webhook_client.rs"]
mod webhook_client;
use webhook_client::{Client, Served};

const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// Spends its whole per-call budget on a 4,000-character port: 4,000 strings of 8,000
/// bytes each would cost 4 million units.
const BOMB: &str = "self.split('').map(x, self + self).size() > 0 ? 1 : 0";

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let args: Vec<String> = std::env::args().collect();
    // `--floor PORT CA_FILE`: this binary as the floor webhook, in a process of its own
    // like the real one, so that neither shares the client's runtime.
    if let Some(at) = args.iter().position(|a| a == "--floor") {
        let port: u16 = args[at + 1].parse().expect("port");
        runtime.block_on(floor_webhook::serve(port, &args[at + 2]));
        return;
    }
    runtime.block_on(run());
}

async fn run() {
    let objects: usize = std::env::var("BENCH_OBJECTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5_000);
    let dir = tempdir();
    let with_cel = format!("{}/examples/conversion/policy.yaml", env!("CARGO_MANIFEST_DIR"));
    let renames_only = format!("{dir}/renames.yaml");
    std::fs::write(
        &renames_only,
        std::fs::read_to_string(&with_cel)
            .expect("example policy")
            .split("      changed:")
            .next()
            .expect("head"),
    )
    .expect("write");

    let floor = Webhook::start_floor(&dir);
    let floor = floor.served();
    println!("conversion webhook vs a webhook that only sets apiVersion (TLS, HTTP/2, loopback)");
    println!(
        "{:<34} {:>10} {:>10} {:>10} {:>9}",
        "workload", "p50", "p99", "total", "vs floor"
    );
    let mut floor_client = Client::connect(&floor, ALPN).await;
    list_of_single_reviews(&mut floor_client, "/convert/gadgets", 100).await;
    let floor_list = list_of_single_reviews(&mut floor_client, "/convert/gadgets", objects).await;
    report(&format!("floor: {objects} 1-object reviews"), &floor_list, None);
    let floor_big = big_reviews(&mut floor_client, "/convert/gadgets", objects, 10).await;
    report(&format!("floor: {objects}-object review"), &floor_big, None);

    for (label, policy) in [("CEL type change", &with_cel), ("renames only", &renames_only)] {
        let webhook = Webhook::start(policy, &dir);
        let served = webhook.served();
        let mut client = Client::connect(&served, ALPN).await;
        assert_eq!(client.version, http::Version::HTTP_2);
        // Warm up: first connection, first compile.
        list_of_single_reviews(&mut client, "/convert/gadgets", 100).await;
        let list = list_of_single_reviews(&mut client, "/convert/gadgets", objects).await;
        report(
            &format!("{label}: {objects} 1-object reviews"),
            &list,
            Some(&floor_list),
        );
        let big = big_reviews(&mut client, "/convert/gadgets", objects, 10).await;
        report(
            &format!("{label}: {objects}-object review"),
            &big,
            Some(&floor_big),
        );
        println!("  webhook peak memory (VmHWM): {:.1} MB", webhook.peak_mb());
    }

    let bomb_policy = format!("{dir}/bomb.yaml");
    std::fs::write(
        &bomb_policy,
        std::fs::read_to_string(&with_cel)
            .expect("example policy")
            .replace("upgrade: \"int(self)\"", &format!("upgrade: \"{BOMB}\"")),
    )
    .expect("write");
    let webhook = Webhook::start(&bomb_policy, &dir);
    let served = webhook.served();
    bombs_and_health(&served).await;
    println!("  webhook peak memory (VmHWM): {:.1} MB", webhook.peak_mb());
}

/// Sends `n` reviews of one object each, one after another; the latency of each.
async fn list_of_single_reviews(client: &mut Client, path: &str, n: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let body = review(vec![gadget(i)]);
        let started = Instant::now();
        let (code, reply) = client.post(path, body).await;
        latencies.push(started.elapsed());
        assert_eq!(code, 200);
        assert!(
            reply.windows(9).any(|w| w == b"\"Success\""),
            "{}",
            String::from_utf8_lossy(&reply)
        );
    }
    latencies
}

async fn big_reviews(client: &mut Client, path: &str, objects: usize, n: usize) -> Vec<Duration> {
    let body = review((0..objects).map(gadget).collect());
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let (code, _) = client.post(path, body.clone()).await;
        latencies.push(started.elapsed());
        assert_eq!(code, 200);
    }
    latencies
}

async fn bombs_and_health(served: &Served) {
    let mut bombs = Vec::new();
    for _ in 0..8 {
        let mut client = Client::connect(served, ALPN).await;
        bombs.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            for _ in 0..5 {
                let mut object = gadget(0);
                object["spec"]["port"] = json!("8".repeat(4_000));
                let started = Instant::now();
                let (_, reply) = client.post("/convert/gadgets", review(vec![object])).await;
                latencies.push(started.elapsed());
                assert!(reply.windows(7).any(|w| w == b"Failure"));
            }
            latencies
        }));
    }
    let mut health = Client::connect(served, ALPN).await;
    let mut health_latencies = Vec::new();
    while bombs.iter().any(|b| !b.is_finished()) {
        let started = Instant::now();
        let (code, _) = health.get("/healthz").await;
        health_latencies.push(started.elapsed());
        assert_eq!(code, 200);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut bomb_latencies = Vec::new();
    for bomb in bombs {
        bomb_latencies.extend(bomb.await.expect("bombs"));
    }
    report("bomb refused (8 clients at once)", &bomb_latencies, None);
    report("/healthz during the bombs", &health_latencies, None);
}

fn report(label: &str, latencies: &[Duration], floor: Option<&[Duration]>) {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    let at = |q: f64| sorted[((sorted.len() as f64 - 1.0) * q).round() as usize];
    let total: Duration = latencies.iter().sum();
    let ratio = floor
        .map(|floor| {
            format!(
                "{:.2}x",
                total.as_secs_f64() / floor.iter().sum::<Duration>().as_secs_f64()
            )
        })
        .unwrap_or_default();
    println!(
        "{label:<34} {:>10} {:>10} {:>10} {ratio:>9}",
        format!("{:.0?}", at(0.5)),
        format!("{:.0?}", at(0.99)),
        format!("{:.1?}", total),
    );
}

fn gadget(i: usize) -> Value {
    json!({"apiVersion": "example.com/v1alpha1", "kind": "Gadget",
           "metadata": {"name": format!("g{i}"), "namespace": "default", "uid": "0b6f4b0e-4e0e-4c8e-9d1a-2f4c0e2a7b11",
                        "resourceVersion": "4711", "generation": 1, "creationTimestamp": "2026-11-22T08:11:18Z",
                        "managedFields": [{"manager": "kubectl-create", "operation": "Update", "apiVersion": "example.com/v1alpha1",
                                           "time": "2026-11-22T08:11:18Z", "fieldsType": "FieldsV1",
                                           "fieldsV1": {"f:spec": {".": {}, "f:size": {}, "f:port": {}}}}]},
           "spec": {"size": i % 7, "port": "8080"}})
}

fn review(objects: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({"kind": "ConversionReview", "apiVersion": "apiextensions.k8s.io/v1",
        "request": {"uid": "7ac9d2dc-cd38-4f35-96df-14b1a42c518b", "desiredAPIVersion": "example.com/v1", "objects": objects}}))
    .expect("json")
}

/// The real webhook, as a child process.
struct Webhook {
    child: Child,
    port: u16,
    ca_pem: String,
}

impl Webhook {
    fn start(policy: &str, dir: &str) -> Webhook {
        Webhook::spawn(dir, |port, ca| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"));
            command.args([
                "webhook",
                "--policy",
                policy,
                "--port",
                &port.to_string(),
                "--ca-out",
                ca,
            ]);
            command
        })
    }

    fn start_floor(dir: &str) -> Webhook {
        Webhook::spawn(dir, |port, ca| {
            let mut command = Command::new(std::env::current_exe().expect("own path"));
            command.args(["--floor", &port.to_string(), ca]);
            command
        })
    }

    fn spawn(dir: &str, command: impl FnOnce(u16, &str) -> Command) -> Webhook {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let ca = format!("{dir}/ca-{port}.pem");
        let child = command(port, &ca)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the webhook starts");
        for _ in 0..500 {
            if std::fs::metadata(&ca).is_ok() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let ca_pem = std::fs::read_to_string(&ca).expect("the CA was written");
        Webhook { child, port, ca_pem }
    }

    fn served(&self) -> Served {
        Served::external(self.port, self.ca_pem.clone())
    }

    fn peak_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tempdir() -> String {
    let dir = std::env::temp_dir().join(format!("crd-lifecycle-webhook-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.to_string_lossy().into_owned()
}
