//! End-to-end suite against a real control plane.
//!
//! With `KUBEBUILDER_ASSETS` naming a directory that holds `etcd` and `kube-apiserver` (and
//! optionally `kube-controller-manager`), the suite starts its own control plane on loopback
//! (`control_plane`), runs every scenario against it and stops it. Without it, it uses the
//! cluster `KUBECONFIG` points at; without a reachable cluster it prints one skip line and
//! succeeds.
//!
//! `cargo test --test e2e` (add `-- NAME ...` to run some scenarios). Local-controller mode (default) starts
//! `crd-lifecycle run` as a child process and needs nothing but an apiserver (a bare
//! kube-apiserver + etcd will do: no Pod is ever scheduled); `E2E_IN_CLUSTER=1` uses the
//! operator deployed from `deploy/` instead. Everything the suite creates carries a unique
//! run id and is deleted afterwards, on success and on failure.

mod balancer;
mod builtin_migration;
mod check;
mod control_plane;
mod env;
mod examples;
#[path = "../support/flags.rs"]
mod flags;
mod leader;
mod least_privilege;
mod proxy;
mod replicas;
mod scenarios;
mod soak;
mod storage_flip;
#[path = "../support/webhook_client.rs"]
mod webhook_client;
mod webhook_rollout;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use env::{Env, Outcome};

type Scenario = for<'a> fn(&'a Env) -> Pin<Box<dyn Future<Output = Outcome> + 'a>>;

const SCENARIOS: &[(&str, Scenario)] = &[
    ("full_lifecycle", |env| Box::pin(scenarios::full_lifecycle(env))),
    ("migration", |env| Box::pin(scenarios::migration(env))),
    ("bad_input", |env| Box::pin(scenarios::bad_input(env))),
    ("restart", |env| Box::pin(scenarios::restart(env))),
    ("gates", |env| Box::pin(scenarios::gates(env))),
    ("conversion_webhook", |env| {
        Box::pin(scenarios::conversion_webhook(env))
    }),
    ("managed_fields", |env| Box::pin(scenarios::managed_fields(env))),
    ("least_privilege", |env| {
        Box::pin(least_privilege::least_privilege(env))
    }),
    ("builtin_migration", |env| {
        Box::pin(builtin_migration::builtin_migration(env))
    }),
    ("builtin_migration_fails", |env| {
        Box::pin(builtin_migration::builtin_migration_fails(env))
    }),
    ("webhook_rollout", |env| {
        Box::pin(webhook_rollout::webhook_rollout(env))
    }),
    ("leader_cut_off", |env| Box::pin(leader::leader_cut_off(env))),
    ("check_flux_upgrade", |env| Box::pin(check::flux_upgrade(env))),
    ("check_rollback", |env| Box::pin(check::rollback(env))),
    ("check_writer_unserved", |env| {
        Box::pin(check::writer_unserved(env))
    }),
    ("check_schema_tightens", |env| {
        Box::pin(check::schema_tightens(env))
    }),
    ("check_least_privilege", |env| {
        Box::pin(check::least_privilege(env))
    }),
    ("flip_during_a_migration", |env| {
        Box::pin(storage_flip::flip_during_a_migration(env))
    }),
    ("flip_during_a_failover", |env| {
        Box::pin(storage_flip::flip_during_a_failover(env))
    }),
    ("flip_after_a_builtin_migration", |env| {
        Box::pin(storage_flip::flip_after_a_builtin_migration(env))
    }),
    ("soak", |env| Box::pin(soak::soak(env))),
];

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("e2e: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(filters))
}

async fn run(filters: Vec<String>) -> ExitCode {
    let control_plane = match control_plane::assets() {
        Some(assets) => {
            let started = Instant::now();
            match control_plane::ControlPlane::start(&assets).await {
                Ok(plane) => {
                    println!(
                        "e2e: started a control plane from KUBEBUILDER_ASSETS={} in {:.1}s (kube-apiserver {}.{}, {})",
                        assets.display(),
                        started.elapsed().as_secs_f64(),
                        plane.version.0,
                        plane.version.1,
                        if plane.has_controller_manager() {
                            "with kube-controller-manager"
                        } else {
                            "no kube-controller-manager"
                        }
                    );
                    Some(plane)
                }
                Err(error) => {
                    // Assets were given: failing to start them is a failure, not a skip.
                    println!("e2e: cannot start the control plane: {error}");
                    return ExitCode::FAILURE;
                }
            }
        }
        None => None,
    };
    let own = control_plane.is_some();
    let env = match Env::connect(control_plane).await {
        Ok(env) => env,
        // The suite's own control plane started: not reaching it is a failure.
        Err(reason) if own => {
            println!("e2e: cannot connect to the control plane the suite started: {reason}");
            return ExitCode::FAILURE;
        }
        Err(reason) => {
            let config = std::env::var("KUBECONFIG").unwrap_or_else(|_| "~/.kube/config".into());
            println!(
                "e2e: SKIPPED: no control plane (KUBEBUILDER_ASSETS unset) and no reachable cluster (KUBECONFIG={config}): {reason}"
            );
            return ExitCode::SUCCESS;
        }
    };
    let mode = if env.in_cluster {
        "in-cluster operator"
    } else {
        "local controller"
    };
    println!(
        "e2e: run {} against Kubernetes {}.{} with a {mode}",
        env.run_id, env.server_version.0, env.server_version.1
    );
    let setup = async {
        env.install_policy_crd().await?;
        env.start_controller()
    };
    if let Err(error) = setup.await {
        println!("e2e: setup failed: {error}");
        env.teardown().await;
        return ExitCode::FAILURE;
    }
    let (mut passed, mut skipped, mut failed) = (0, 0, 0);
    for (name, scenario) in SCENARIOS {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        if let Some(plane) = env.control_plane()
            && let Some(exited) = plane.revive_controller_manager().await
        {
            println!(
                "e2e: kube-controller-manager had exited ({exited}); started again (its log: kube-controller-manager.log)"
            );
        }
        let started = Instant::now();
        let limit = scenario_limit(name);
        let outcome = match tokio::time::timeout(limit, scenario(&env)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!("timed out after {limit:?}")),
        };
        env.cleanup_scenario().await;
        match (outcome, env::skipped(name)) {
            (Ok(()), Some(reason)) => {
                skipped += 1;
                println!("e2e: {name} ... SKIPPED: {reason}");
            }
            (Ok(()), None) => {
                passed += 1;
                println!("e2e: {name} ... ok ({:.1}s)", started.elapsed().as_secs_f64());
            }
            (Err(error), _) => {
                failed += 1;
                println!("e2e: {name} ... FAILED: {error}");
            }
        }
    }
    env.teardown().await;
    println!("e2e: {passed} passed, {skipped} skipped, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How long a scenario may take: 10 minutes, and for the soak its own length on top.
fn scenario_limit(name: &str) -> Duration {
    let soak = std::env::var("SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(120);
    Duration::from_secs(600 + if name == "soak" { soak } else { 0 })
}
