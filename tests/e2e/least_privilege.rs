//! The controller with the base RBAC of `deploy/rbac.yaml` alone: a migration is refused
//! before any object is touched (`MissingPermission`, with the ClusterRole to add), and runs
//! once the labelled ClusterRole for the CRD's group exists. No other team's Secret is
//! readable.

use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::{Value, json};

use crate::ensure;
use crate::env::{Env, Outcome, in_seconds, wait_for};

const BASE_RBAC: &str = include_str!("../../deploy/rbac.yaml");

/// The base ClusterRoles, renamed for this run and bound to `account` in `default`: the
/// same grants the deployed operator has.
async fn bind_base_rbac(env: &Env, account: &str) -> Outcome {
    let documents: Vec<Value> = serde_saphyr::from_multiple(BASE_RBAC).map_err(|e| e.to_string())?;
    let roles: Vec<&Value> = documents.iter().filter(|d| d["kind"] == "ClusterRole").collect();
    ensure!(
        roles.len() == 2,
        "deploy/rbac.yaml has {} ClusterRoles",
        roles.len()
    );
    for role in roles {
        let mut role = role.clone();
        let name = format!(
            "{}-{}",
            env.run_id,
            role["metadata"]["name"].as_str().unwrap_or_default()
        );
        role["metadata"]["name"] = json!(name);
        let role: ClusterRole = serde_json::from_value(role).map_err(|e| e.to_string())?;
        env.create_cluster_role(role).await?;
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}],
        }))
        .map_err(|e| e.to_string())?;
        env.create_cluster_role_binding(binding).await?;
    }
    Ok(())
}

pub async fn least_privilege(env: &Env) -> Outcome {
    // Who the operator runs as: the deployed ServiceAccount in-cluster; locally, a
    // ServiceAccount bound to the base roles, impersonated by a controller of its own.
    let (user, account) = if env.in_cluster {
        (
            "system:serviceaccount:crd-lifecycle:crd-lifecycle".to_owned(),
            None,
        )
    } else {
        let account = format!("{}-operator", env.run_id);
        env.create_service_account(&account).await?;
        bind_base_rbac(env, &account).await?;
        let user = format!("system:serviceaccount:default:{account}");
        let kubeconfig = env.kubeconfig_as(&user)?;
        env.kill_controller();
        env.start_controller_with(&kubeconfig)?;
        (user, Some(account))
    };
    let outcome = scenario(env, &user, account.as_deref()).await;
    if !env.in_cluster {
        // Back to the suite's own controller for the scenarios after this one.
        env.kill_controller();
        env.start_controller()?;
    }
    outcome
}

async fn scenario(env: &Env, user: &str, account: Option<&str>) -> Outcome {
    // Least privilege: no Secret but the webhook's own, and nothing of other teams.
    for (verb, resource, name, namespace) in [
        ("get", "secrets", "other", "crd-lifecycle"),
        ("patch", "secrets", "other", "crd-lifecycle"),
        ("patch", "secrets", "other", "default"),
        ("patch", "deployments", "other", "default"),
    ] {
        ensure!(
            !env.can(user, verb, resource, name, namespace).await?,
            "{user} may {verb} {resource}/{name} in {namespace}"
        );
    }

    let crd = env
        .create_crd_ungranted("rbac", &[("v1alpha1", true, true), ("v1", true, false)])
        .await?;
    env.create_objects(&crd, "v1alpha1", 20).await?;
    let (store, _) = in_seconds(3);
    let name = format!("{}-rbac", env.run_id);
    env.create_policy(json!({
        "apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
        "metadata": {"name": name},
        "spec": {"crdName": crd.name, "versions": [{"name": "v1", "store": {"at": store}}],
                 "migration": {"enabled": true, "preflight": false}},
    }))
    .await?;

    wait_for("MissingPermission", Duration::from_secs(60), || async {
        Ok(env.condition(&name, "Blocked").await?.1 == "MissingPermission")
    })
    .await?;
    let (_, _, message) = env.condition(&name, "Blocked").await?;
    ensure!(
        message.contains(&format!("patch widgets in API group {}", crd.group))
            && message.contains(&format!("crd-lifecycle-migrator-{}", crd.name)),
        "the message names the verb and the ClusterRole: {message}"
    );
    ensure!(
        env.condition(&name, "Stalled").await?.0 == "True",
        "Stalled while a grant is missing"
    );
    ensure!(
        env.event_reasons(&name)
            .await?
            .iter()
            .any(|r| r == "MissingPermission"),
        "a MissingPermission event"
    );
    let status = env.policy(&name).await?["status"].clone();
    ensure!(status["migration"].is_null(), "no migration started: {status}");
    ensure!(
        env.stored_versions(&crd.name).await? == ["v1alpha1", "v1"],
        "nothing migrated or trimmed"
    );

    // The team adds the labelled ClusterRole: the operator re-checks within a minute.
    env.grant(&crd.name).await?;
    if let Some(account) = account {
        aggregate_or_bind(env, account, &crd.name).await?;
    }
    wait_for("the migration succeeds", Duration::from_secs(120), || async {
        Ok(env.policy(&name).await?["status"]["migration"]["phase"] == "Succeeded")
    })
    .await?;
    ensure!(
        env.stored_versions(&crd.name).await? == ["v1"],
        "storedVersions trimmed"
    );
    Ok(())
}

/// Waits for the controller manager to aggregate the grant into this run's migrator role.
/// A bare kube-apiserver (no controller manager, as local mode allows) never does: then
/// the labelled role is bound to the account directly, which grants the same.
async fn aggregate_or_bind(env: &Env, account: &str, crd: &str) -> Outcome {
    let migrator = format!("{}-crd-lifecycle-migrator", env.run_id);
    let api: kube::Api<ClusterRole> = kube::Api::all(env.clone_client());
    let aggregated = wait_for("the grant is aggregated", Duration::from_secs(20), || async {
        let role = api.get(&migrator).await.map_err(|e| e.to_string())?;
        Ok(role.rules.is_some_and(|rules| !rules.is_empty()))
    })
    .await;
    if aggregated.is_ok() {
        return Ok(());
    }
    // With the suite's own controller manager, aggregation must work.
    ensure!(
        !env.control_plane().is_some_and(|p| p.has_controller_manager()),
        "the controller manager the suite started did not aggregate the grant into {migrator} within 20 s"
    );
    println!(
        "e2e: least_privilege: no ClusterRole aggregation (no controller manager): binding the grant directly"
    );
    let role = format!("crd-lifecycle-migrator-{crd}");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{}-grant", env.run_id)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}],
    }))
    .map_err(|e| e.to_string())?;
    env.create_cluster_role_binding(binding).await
}
