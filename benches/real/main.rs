//! Benchmarks on a real control plane: `scripts/bench-real.sh` (or
//! `KUBEBUILDER_ASSETS=/path/to/bin cargo bench --bench real`).
//!
//! Starts etcd, kube-apiserver and kube-controller-manager from `KUBEBUILDER_ASSETS` on
//! loopback (the e2e suite's harness, `tests/e2e/control_plane.rs`) and measures, each
//! beside its target (issue 30):
//!
//! - `migrate`: `crd-lifecycle migrate` of 5,000 and 50,000 objects at concurrency 16 against
//!   a raw client making the same requests (metadata pages of 500, one no-op merge patch per
//!   object) over the same objects; on a CRD whose storage version switched more than a
//!   minute before, and on one switched a moment ago. Target: ≥ 1.0× the raw client.
//! - `webhook`: 200 GETs of single objects and LISTs of 5,000 through a version that needs
//!   conversion, with the CRD's `spec.conversion` pointed at `crd-lifecycle webhook` and then
//!   at a minimal webhook on the same HTTP and TLS stack that only rewrites `apiVersion`.
//!   Target: ≤ 1.0× the minimal webhook's time.
//! - `fleet`: 1,000 policies whose `introduce` falls in the same second, run by
//!   `crd-lifecycle run`: how late each CRD patch landed against a raw client making the
//!   same 1,000 CRD patches (target: worst ≤ 1.2×), and reconciles per policy from creation
//!   to rest (target: ≤ 3).
//!
//! `BENCH_REAL=migrate,webhook,fleet` picks sections; `BENCH_MIGRATE_SIZES`,
//! `BENCH_WEBHOOK_OBJECTS` and `BENCH_POLICIES` change the sizes. Never run by CI:
//! benchmarks do not gate anything.

// The e2e suite's control plane, as it is (one copy).
#[allow(dead_code)]
#[path = "../../tests/e2e/control_plane.rs"]
mod control_plane;
#[path = "../support/floor_webhook.rs"]
mod floor_webhook;

mod cluster;
mod fleet;
mod migrate;
mod webhook;

use std::time::Instant;

use cluster::Cluster;

/// One figure beside its target.
pub struct Figure {
    pub name: String,
    pub value: String,
    pub target: String,
    pub met: Option<bool>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // `--floor PORT CA_FILE`: this binary as the minimal webhook, in a process of its own.
    if let Some(at) = args.iter().position(|a| a == "--floor") {
        let port: u16 = args[at + 1].parse().expect("port");
        runtime.block_on(floor_webhook::serve(port, &args[at + 2]));
        return;
    }
    // `cargo bench` passes `--bench`; a filter like `cargo bench --bench real -- fleet` too.
    let sections: Vec<String> = std::env::var("BENCH_REAL")
        .ok()
        .map(|s| s.split(',').map(|p| p.trim().to_owned()).collect())
        .or_else(|| {
            let named: Vec<String> = args
                .iter()
                .skip(1)
                .filter(|a| !a.starts_with('-'))
                .cloned()
                .collect();
            (!named.is_empty()).then_some(named)
        })
        .unwrap_or_else(|| vec!["migrate".into(), "webhook".into(), "fleet".into()]);
    let code = runtime.block_on(run(&sections));
    std::process::exit(code);
}

async fn run(sections: &[String]) -> i32 {
    let Some(assets) = control_plane::assets() else {
        eprintln!(
            "bench real: KUBEBUILDER_ASSETS is not set: it must name a directory with etcd, kube-apiserver and kube-controller-manager (docs/src/internals/e2e.md)"
        );
        return 2;
    };
    let started = Instant::now();
    let plane = match control_plane::ControlPlane::start(&assets).await {
        Ok(plane) => plane,
        Err(error) => {
            eprintln!("bench real: cannot start the control plane: {error}");
            return 1;
        }
    };
    let cluster = match Cluster::connect(&plane).await {
        Ok(cluster) => cluster,
        Err(error) => {
            eprintln!("bench real: {error}");
            return 1;
        }
    };
    println!(
        "control plane: kube-apiserver {} with etcd ({}) from {}, started in {:.1}s",
        cluster.server_version,
        if plane.has_controller_manager() {
            "and kube-controller-manager"
        } else {
            "no kube-controller-manager"
        },
        assets.display(),
        started.elapsed().as_secs_f64()
    );
    println!("machine: {}", cluster::machine());
    let mut figures = Vec::new();
    for section in sections {
        let result = match section.as_str() {
            "migrate" => migrate::run(&cluster).await,
            "webhook" => webhook::run(&cluster).await,
            "fleet" => fleet::run(&cluster).await,
            other => Err(format!("unknown section {other:?} (migrate, webhook, fleet)")),
        };
        match result {
            Ok(mut found) => figures.append(&mut found),
            Err(error) => {
                eprintln!(
                    "bench real: {section}: {error} (control plane logs: {})",
                    plane.log_dir().display()
                );
                plane.stop();
                return 1;
            }
        }
    }
    println!();
    println!(
        "summary (kube-apiserver {}, {}):",
        cluster.server_version,
        cluster::machine()
    );
    println!("{:<58} {:>16} {:>14}  met", "figure", "measured", "target");
    for figure in &figures {
        let met = match figure.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "",
        };
        println!(
            "{:<58} {:>16} {:>14}  {met}",
            figure.name, figure.value, figure.target
        );
    }
    plane.stop();
    0
}
