//! End-to-end suite against the cluster `KUBECONFIG` points at.
//!
//! `cargo test --test e2e` (add `-- NAME ...` to run some scenarios). Without a reachable
//! cluster it prints one skip line and succeeds. Local-controller mode (default) starts
//! `crd-lifecycle run` as a child process and needs nothing but an apiserver (a bare
//! kube-apiserver + etcd will do: no Pod is ever scheduled); `E2E_IN_CLUSTER=1` uses the
//! operator deployed from `deploy/` instead. Everything the suite creates carries a unique
//! run id and is deleted afterwards, on success and on failure.

mod builtin_migration;
mod env;
#[path = "../support/flags.rs"]
mod flags;
mod least_privilege;
mod scenarios;
mod storage_flip;

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
    ("flip_during_a_migration", |env| {
        Box::pin(storage_flip::flip_during_a_migration(env))
    }),
    ("flip_during_a_failover", |env| {
        Box::pin(storage_flip::flip_during_a_failover(env))
    }),
    ("flip_after_a_builtin_migration", |env| {
        Box::pin(storage_flip::flip_after_a_builtin_migration(env))
    }),
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
    let env = match Env::connect().await {
        Ok(env) => env,
        Err(reason) => {
            let config = std::env::var("KUBECONFIG").unwrap_or_else(|_| "~/.kube/config".into());
            println!("e2e: SKIPPED: no reachable cluster (KUBECONFIG={config}): {reason}");
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
    let (mut passed, mut failed) = (0, 0);
    for (name, scenario) in SCENARIOS {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let started = Instant::now();
        let outcome = match tokio::time::timeout(Duration::from_secs(600), scenario(&env)).await {
            Ok(outcome) => outcome,
            Err(_) => Err("timed out after 10 minutes".to_owned()),
        };
        env.cleanup_scenario().await;
        match outcome {
            Ok(()) => {
                passed += 1;
                println!("e2e: {name} ... ok ({:.1}s)", started.elapsed().as_secs_f64());
            }
            Err(error) => {
                failed += 1;
                println!("e2e: {name} ... FAILED: {error}");
            }
        }
    }
    env.teardown().await;
    println!("e2e: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
