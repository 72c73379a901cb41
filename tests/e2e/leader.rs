//! A leader cut off from the apiserver stops acting: two replicas with leader election, each
//! talking to the apiserver through a proxy the test controls; the leader's proxy is cut while
//! a milestone is due. The standby takes over once the lease has expired, applies the
//! milestone, and the cut-off leader makes no write after its lease ran out (every request it
//! sent is recorded at its proxy, those held after the cut included). The cut then heals: a
//! leader that had not stepped down would write again, and its proxy would record it.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::json;

use crate::control_plane::free_port;
use crate::ensure;
use crate::env::{Env, Outcome, in_seconds, wait_for};
use crate::proxy::Proxy;
use crate::replicas::Replica;

/// The controller's lease timing (`LeaseSettings::new`): valid 15 s without renewal, given up
/// by its holder after 10 s without one.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RENEW_DEADLINE: Duration = Duration::from_secs(10);

pub async fn leader_cut_off(env: &Env) -> Outcome {
    if env.in_cluster {
        return crate::env::skip(
            "leader_cut_off",
            "in-cluster mode (the deployed operator would act too)",
        );
    }
    // The suite's own controller runs without leader election: it must not act meanwhile.
    env.kill_controller();
    let result = cut_off(env).await;
    env.start_controller()?;
    result
}

async fn holder(env: &Env, lease: &str) -> Result<Option<String>, String> {
    let leases: kube::Api<Lease> = kube::Api::namespaced(env.client.clone(), "default");
    Ok(leases
        .get_opt(lease)
        .await
        .map_err(|e| e.to_string())?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

async fn cut_off(env: &Env) -> Outcome {
    let lease = format!("{}-leader", env.run_id);
    let dir = std::env::temp_dir();
    let mut replicas = Vec::new();
    let mut proxies = Vec::new();
    for name in ["a", "b"] {
        let proxy = Proxy::start(env.clone_client()).await?;
        let kubeconfig = dir.join(format!("{}-leader-{name}.kubeconfig", env.run_id));
        std::fs::write(&kubeconfig, proxy.kubeconfig()).map_err(|e| e.to_string())?;
        let metrics = free_port()?;
        replicas.push(Replica::new(
            &format!("{}-{name}", env.run_id),
            vec![
                "--leader-election=true".into(),
                format!("--lease-name={lease}"),
                format!("--metrics-addr=127.0.0.1:{metrics}"),
                "--resync=30s".into(),
            ],
            Some(kubeconfig),
            dir.join(format!("crd-lifecycle-{}-leader-{name}.log", env.run_id)),
        ));
        proxies.push(proxy);
    }
    let (a, b) = (0, 1);
    replicas[a].start()?;
    let identity_a = replicas[a].identity.clone();
    wait_for("replica a holds the lease", Duration::from_secs(30), || async {
        Ok(holder(env, &lease).await?.as_deref() == Some(identity_a.as_str()))
    })
    .await?;
    replicas[b].start()?;

    let crd = env
        .create_crd("leader", &[("v1alpha1", true, true), ("v1", false, false)])
        .await?;
    let name = format!("{}-leader", env.run_id);
    let (later, _) = in_seconds(3600);
    env.create_policy(
        json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
        "metadata": {"name": name},
        "spec": {"crdName": crd.name, "versions": [{"name": "v1", "introduce": {"at": later}}],
                 "migration": {"enabled": false}}}),
    )
    .await?;
    // The leader has reconciled the policy (its status): cut it off, then bring the milestone
    // forward to 3 s from now, so that it is due while the leader is cut off and before the
    // standby may take over, however long the first reconcile took.
    wait_for(
        "the leader reconciles the policy",
        Duration::from_secs(30),
        || async { Ok(env.policy(&name).await?["status"]["observedGeneration"].is_i64()) },
    )
    .await?;
    let cut_at = Instant::now();
    proxies[a].cut();
    let (introduce, _) = in_seconds(3);
    env.patch_policy(
        &name,
        json!({"spec": {"versions": [{"name": "v1", "introduce": {"at": introduce}}]}}),
    )
    .await?;

    // The standby applies the milestone once it leads.
    wait_for(
        "the standby takes over and serves v1",
        Duration::from_secs(60),
        || async { Ok(env.flags(&crd.name).await?.contains("v1:s")) },
    )
    .await?;
    let identity_b = replicas[b].identity.clone();
    ensure!(
        holder(env, &lease).await?.as_deref() == Some(identity_b.as_str()),
        "the lease is not held by the standby after it took over"
    );

    // The partition heals: a replica that still thought it led would act again now.
    proxies[a].heal();
    tokio::time::sleep(Duration::from_secs(10)).await;

    // Its lease ran out LEASE_DURATION after its last successful write of it (the create that
    // won it, or a renewal).
    let leases_path = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let lease_path = format!("{leases_path}/{lease}");
    let seen_a = proxies[a].seen();
    let last_renewal = seen_a
        .iter()
        .filter(|s| {
            (s.method == "PUT" && s.path.starts_with(&lease_path) && s.status == Some(200))
                || (s.method == "POST" && s.path.starts_with(leases_path) && s.status == Some(201))
        })
        .map(|s| s.at)
        .max()
        .ok_or("replica a never wrote its lease through its proxy")?;
    let expired_at = last_renewal + LEASE_DURATION;
    // It stops writing by its renew deadline after its last renewal, before the lease runs
    // out for the others.
    let stopped_by = last_renewal + RENEW_DEADLINE;
    let late: Vec<String> = seen_a
        .iter()
        .filter(|s| s.is_write() && s.at >= stopped_by)
        .map(|s| {
            let after = if s.at >= expired_at {
                format!("{:?} after the lease ran out", s.at - expired_at)
            } else {
                format!("{:?} after its renew deadline", s.at - stopped_by)
            };
            format!("{} {} ({after})", s.method, s.path)
        })
        .collect();
    ensure!(
        late.is_empty(),
        "the cut-off leader wrote after its renew deadline: {}",
        late.join("; ")
    );
    let after_cut: Vec<String> = seen_a
        .iter()
        .filter(|s| s.is_write() && s.at >= cut_at)
        .map(|s| {
            let fate = if s.forwarded { "forwarded" } else { "held" };
            format!("{} {} at cut+{:?} ({fate})", s.method, s.path, s.at - cut_at)
        })
        .collect();
    println!(
        "e2e: leader_cut_off: leader's last renewal cut-{:?}, writes it attempted after the cut: {}",
        cut_at.saturating_duration_since(last_renewal),
        if after_cut.is_empty() {
            "none".to_owned()
        } else {
            after_cut.join("; ")
        }
    );

    // The cut-off leader gave up leadership once it could not renew for the renew deadline,
    // and stands by in the same process (its webhook, probes and metrics serve on).
    let stood_by = wait_for(
        "the cut-off leader stands by",
        RENEW_DEADLINE + Duration::from_secs(20),
        || {
            let log = replicas[a].log_of_this_start();
            async move { Ok(log.contains("standing by to lead again")) }
        },
    )
    .await;
    ensure!(
        stood_by.is_ok(),
        "replica a did not say it stands by {:?} after it was cut off",
        cut_at.elapsed()
    );
    ensure!(
        replicas[a].is_running(),
        "replica a exited after it lost its lease: {:?}",
        replicas[a].exited()
    );

    // The standby took over no earlier than the lease allowed, and it made the CRD change.
    let seen_b = proxies[b].seen();
    let takeover = seen_b
        .iter()
        .filter(|s| s.method == "PUT" && s.path.starts_with(&lease_path) && s.status == Some(200))
        .map(|s| s.at)
        .min()
        .ok_or("the standby never wrote the lease")?;
    ensure!(
        takeover >= expired_at,
        "the standby took the lease {:?} before it expired",
        expired_at - takeover
    );
    let crd_path = format!(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{}",
        crd.name
    );
    ensure!(
        seen_b
            .iter()
            .any(|s| s.method == "PATCH" && s.path.starts_with(&crd_path) && s.status == Some(200)),
        "the CRD patch that serves v1 did not come from the standby"
    );
    for replica in &mut replicas {
        replica.terminate(Duration::from_secs(10));
    }
    Ok(())
}
