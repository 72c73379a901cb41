//! `crd-lifecycle migrate` against a raw client on the real apiserver.
//!
//! Per size, one CRD with versions v1 and v2 and that many objects (10 namespaces). Every
//! pass first moves the storage version to the other version, so that each pass re-encodes
//! every object (the same work for both clients), then either waits until the CRD has been
//! unchanged for more than a minute (`settled`: the migrator's settle check needs one
//! discovery answer) or starts at once (`just switched`: five answers a second apart before
//! the first write). The raw client and the migrator alternate, each on the same objects.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::Figure;
use crate::cluster::{Cluster, crd};

#[path = "../support/raw_client.rs"]
mod raw_client;

const CONCURRENCY: usize = 16;
const PAGE_SIZE: u32 = 500;
const NAMESPACES: usize = 10;
const GROUP: &str = "migrate.bench.example.com";
/// The migrator's shortcut: a CRD unchanged for a minute (by its managedFields time, whole
/// seconds) needs one discovery answer.
const SETTLED_AFTER: Duration = Duration::from_secs(63);

pub async fn run(cluster: &Cluster) -> Result<Vec<Figure>, String> {
    let sizes: Vec<usize> = std::env::var("BENCH_MIGRATE_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![5_000, 50_000]);
    let rounds: usize = std::env::var("BENCH_MIGRATE_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    println!();
    println!(
        "migrate: crd-lifecycle migrate vs a raw client, concurrency {CONCURRENCY}, pages of {PAGE_SIZE}, {rounds} rounds"
    );
    cluster.create_namespaces(NAMESPACES).await?;
    let mut figures = Vec::new();
    for size in sizes {
        let plural = format!("widgets{size}");
        let kind = format!("Widget{size}");
        let name = format!("{plural}.{GROUP}");
        cluster
            .create_crds(
                vec![crd(
                    GROUP,
                    &plural,
                    &kind,
                    &[("v1", true, true), ("v2", true, false)],
                )],
                1,
            )
            .await?;
        let created = Instant::now();
        cluster
            .create_objects(GROUP, "v1", &plural, &kind, size, NAMESPACES)
            .await?;
        println!(
            "  {size} objects created in {:.1}s ({:.0}/s)",
            created.elapsed().as_secs_f64(),
            size as f64 / created.elapsed().as_secs_f64()
        );
        println!(
            "  {:>7}  {:<14}  {:<9}  {:>10}  {:>9}",
            "objects", "CRD", "client", "objects/s", "seconds"
        );
        let mut storage = "v1";
        for settled in [true, false] {
            let (mut raw_rates, mut migrator_rates) = (Vec::new(), Vec::new());
            // The migrator's settle check before its first write (from its summary).
            let mut settle_waits = Vec::new();
            let mut after_settle_rates = Vec::new();
            let mut raw_after_rates = Vec::new();
            for _ in 0..rounds {
                for client in ["raw", "migrator"] {
                    storage = if storage == "v1" { "v2" } else { "v1" };
                    cluster.set_storage(&name, storage).await?;
                    if settled {
                        tokio::time::sleep(SETTLED_AFTER).await;
                    }
                    let started = Instant::now();
                    // Each side's time before its first write could start: the raw
                    // client's first page, the migrator's settle check (which lists its
                    // first page meanwhile).
                    let (done, before_first_write) = match client {
                        "raw" => {
                            let pass = raw_client::rewrite_all(
                                &cluster.client,
                                &format!("/apis/{GROUP}/{storage}/{plural}"),
                                PAGE_SIZE,
                                CONCURRENCY,
                            )
                            .await;
                            (pass.objects, pass.first_page.as_secs_f64())
                        }
                        _ => {
                            let (listed, settle) = migrator(cluster, &name)?;
                            settle_waits.push(settle);
                            (listed, settle)
                        }
                    };
                    let seconds = started.elapsed().as_secs_f64();
                    if done != size as u64 {
                        return Err(format!("{client} rewrote {done} objects of {size}"));
                    }
                    let rate = size as f64 / seconds;
                    let after = size as f64 / (seconds - before_first_write).max(1e-9);
                    match client {
                        "raw" => {
                            raw_rates.push(rate);
                            raw_after_rates.push(after);
                        }
                        _ => {
                            migrator_rates.push(rate);
                            after_settle_rates.push(after);
                        }
                    }
                    println!(
                        "  {size:>7}  {:<14}  {client:<9}  {rate:>10.0}  {seconds:>9.1}",
                        if settled { "settled" } else { "just switched" }
                    );
                }
                if client_trimmed(cluster, &name, storage).await? {
                    continue;
                }
                return Err(format!("the migrator left {name}'s storedVersions untrimmed"));
            }
            let mean = |rates: &[f64]| rates.iter().sum::<f64>() / rates.len().max(1) as f64;
            let best_raw = raw_rates.iter().copied().fold(0.0, f64::max);
            let ratio = mean(&migrator_rates) / best_raw.max(1e-9);
            if settled {
                figures.push(Figure {
                    name: format!("migrate {size}, settled: migrator mean / best raw"),
                    value: format!("{ratio:.2}x ({:.0} vs {best_raw:.0}/s)", mean(&migrator_rates)),
                    target: "≥ 1.00x".into(),
                    met: Some(ratio >= 1.0),
                });
            } else {
                // A CRD changed less than a minute ago: before its first write the migrator
                // confirms, five discovery answers a second apart, that the apiservers
                // store in the new version (an HA peer behind would write the old one). The
                // raw client makes no such check; the target is on each side's run from the
                // moment its first write could start (the raw client's: its first page).
                let settle = mean(&settle_waits);
                figures.push(Figure {
                    name: format!("migrate {size}, just switched: migrator mean / best raw"),
                    value: format!(
                        "{ratio:.2}x ({:.0} vs {best_raw:.0}/s, {settle:.1}s settle check)",
                        mean(&migrator_rates)
                    ),
                    target: String::new(),
                    met: None,
                });
                let best_raw_after = raw_after_rates.iter().copied().fold(0.0, f64::max);
                let after = mean(&after_settle_rates) / best_raw_after.max(1e-9);
                figures.push(Figure {
                    name: format!("migrate {size}, just switched, from the first write"),
                    value: format!(
                        "{after:.2}x ({:.0} vs {best_raw_after:.0}/s)",
                        mean(&after_settle_rates)
                    ),
                    target: "≥ 1.00x".into(),
                    met: Some(after >= 1.0),
                });
            }
        }
    }
    Ok(figures)
}

/// Whether the last migrator pass trimmed `storedVersions` to the storage version.
async fn client_trimmed(cluster: &Cluster, crd: &str, storage: &str) -> Result<bool, String> {
    Ok(cluster.stored_versions(crd).await? == [storage])
}

/// `crd-lifecycle migrate CRD` as a child process; the objects it listed (and rewrote or
/// found rewritten: it fails otherwise), and how long its settle check before the first
/// write took (seconds; 0 when its summary does not tell, under a second).
fn migrator(cluster: &Cluster, crd: &str) -> Result<(u64, f64), String> {
    let output = Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"))
        .args([
            "migrate",
            crd,
            "--concurrency",
            &CONCURRENCY.to_string(),
            "--page-size",
            &PAGE_SIZE.to_string(),
            "--log-format",
            "json",
        ])
        .env("KUBECONFIG", &cluster.kubeconfig)
        .output()
        .map_err(|e| format!("cannot run crd-lifecycle migrate: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "crd-lifecycle migrate {crd} failed ({}):\n{stdout}\n{stderr}",
            output.status
        ));
    }
    // The summary: "migrated ...: N listed, N rewritten, ..." (docs/src/concepts/engines.md).
    let summary = format!("{stdout}\n{stderr}");
    let listed = summary
        .split(|c: char| !c.is_ascii_alphanumeric())
        .collect::<Vec<_>>()
        .windows(2)
        .find_map(|w| (w[1] == "listed").then(|| w[0].parse::<u64>().ok()).flatten())
        .ok_or_else(|| format!("no 'N listed' in the output of crd-lifecycle migrate:\n{summary}"))?;
    // "... in 11.2s (4.1s of it confirming the apiservers act on the CRD as it is)".
    let settle = summary
        .split_once("s of it confirming")
        .and_then(|(before, _)| before.rsplit('(').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    Ok((listed, settle))
}
