//! `spec.migration.engine: StorageVersionMigration` on a server that serves
//! storagemigration.k8s.io (Kubernetes 1.35+ with the StorageVersionMigrator feature and
//! the kube-controller-manager's svm controller); elsewhere (1.24, or the API off) it skips
//! with one line.

use std::time::Duration;

use crd_lifecycle::migrate::builtin::{self, State};
use serde_json::json;

use crate::ensure;
use crate::env::{Env, Outcome, builtin_migrations, in_seconds, wait_for};

pub async fn builtin_migration(env: &Env) -> Outcome {
    let Some(api) = builtin_migrations(env, "builtin_migration").await? else {
        return Ok(());
    };
    let crd = env
        .create_crd("builtin", &[("v1alpha1", true, true), ("v1", true, false)])
        .await?;
    let count = 200;
    env.create_objects(&crd, "v1alpha1", count).await?;
    let (store, _) = in_seconds(5);
    let name = format!("{}-builtin", env.run_id);
    env.create_policy(
        json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
        "metadata": {"name": name},
        "spec": {"crdName": crd.name,
                 "versions": [{"name": "v1alpha1"}, {"name": "v1", "store": {"at": store}}],
                 "migration": {"enabled": true, "engine": "StorageVersionMigration"}}}),
    )
    .await?;
    let (plural, group) = crd.name.split_once('.').unwrap_or_default();
    // The policy's migration exists once the store has landed.
    wait_for(
        "the StorageVersionMigration is created",
        Duration::from_secs(60),
        || async {
            let ours = api.of_resource(group, plural).await.map_err(|e| e.to_string())?;
            Ok(ours
                .migrations
                .iter()
                .any(|m| m.policy.as_deref() == Some(name.as_str())))
        },
    )
    .await?;
    // The built-in controller is slow to start (sample 35: 82 s for 20 objects).
    wait_for(
        "storedVersions is trimmed to [v1]",
        Duration::from_secs(300),
        || async { Ok(env.stored_versions(&crd.name).await? == ["v1"]) },
    )
    .await?;
    let ours = api.of_resource(group, plural).await.map_err(|e| e.to_string())?;
    let svm = ours
        .migrations
        .iter()
        .find(|m| m.policy.as_deref() == Some(name.as_str()))
        .ok_or("the policy's StorageVersionMigration is gone")?;
    ensure!(
        svm.state == State::Succeeded,
        "StorageVersionMigration {} is {:?}",
        svm.name,
        svm.state
    );
    ensure!(
        svm.name == builtin::migration_name(&crd.name, "v1", 1),
        "named {}",
        svm.name
    );
    // The fake apiserver's rule for a success (tests/support/apiserver/migrations.rs,
    // `trim_stored_versions`): the CRD says so.
    let (live, migrating) = storage_migrating(env, &crd.name).await?;
    println!("e2e: builtin_migration: the CRD's StorageMigrating condition: {migrating}");
    ensure!(
        migrating["status"] == "False"
            && migrating["reason"] == "MigrationSucceeded"
            && migrating["observedGeneration"] == live["metadata"]["generation"],
        "the CRD's StorageMigrating condition after a success: {migrating}"
    );
    wait_for(
        "status.migration says Succeeded",
        Duration::from_secs(30),
        || async {
            let migration = env.policy(&name).await?["status"]["migration"].clone();
            Ok(
                migration["phase"] == "Succeeded"
                    && migration["storageVersionMigration"] == svm.name.as_str(),
            )
        },
    )
    .await?;
    Ok(())
}

/// A StorageVersionMigration that fails: Kubernetes trims `storedVersions` as it ends
/// (tests/fixtures/svm-failed-trims-stored-versions.txt), with every object still stored in
/// the old version. The controller lists that version again and marks the migration; a
/// removal due afterwards does not land, and etcd still holds every object, readable.
pub async fn builtin_migration_fails(env: &Env) -> Outcome {
    let Some(api) = builtin_migrations(env, "builtin_migration_fails").await? else {
        return Ok(());
    };
    let crd = env
        .create_crd("svmfail", &[("v1alpha1", true, true), ("v1", true, false)])
        .await?;
    let count = 20;
    env.create_objects(&crd, "v1alpha1", count).await?;
    // Every update of the objects is refused (422): the svm controller's first patch fails
    // the migration.
    let vap = format!("{}-freeze", env.run_id);
    env.create_raw(
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
               "metadata": {"name": vap},
               "spec": {"failurePolicy": "Fail",
                        "matchConstraints": {"resourceRules": [{"apiGroups": [crd.group], "apiVersions": ["*"],
                                                                "operations": ["UPDATE"], "resources": ["widgets"]}]},
                        "validations": [{"expression": "false", "message": "frozen by the e2e suite"}]}}),
    )
    .await?;
    env.create_raw(
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": vap},
               "spec": {"policyName": vap, "validationActions": ["Deny"]}}),
    )
    .await?;
    let (store, _) = in_seconds(5);
    let name = format!("{}-svmfail", env.run_id);
    env.create_policy(
        json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
        "metadata": {"name": name},
        "spec": {"crdName": crd.name,
                 "versions": [{"name": "v1alpha1"}, {"name": "v1", "store": {"at": store}}],
                 "migration": {"enabled": true, "engine": "StorageVersionMigration"}}}),
    )
    .await?;
    let (plural, group) = crd.name.split_once('.').unwrap_or_default();
    let first = builtin::migration_name(&crd.name, "v1", 1);
    wait_for(
        "the StorageVersionMigration fails and its end is processed",
        Duration::from_secs(300),
        || async {
            let listed = api.of_resource(group, plural).await.map_err(|e| e.to_string())?;
            Ok(listed
                .migrations
                .iter()
                .any(|m| m.name == first && matches!(m.state, State::Failed(_)) && !m.running))
        },
    )
    .await?;
    // Kubernetes processed the end at the generation it ran at, so it trimmed storedVersions
    // (finishCRDMigration trims when the StorageMigrating condition's observedGeneration is
    // the CRD's generation).
    let (live, migrating) = storage_migrating(env, &crd.name).await?;
    println!("e2e: builtin_migration_fails: the CRD's StorageMigrating condition: {migrating}");
    ensure!(
        migrating["status"] == "False"
            && migrating["reason"] == "MigrationFailed"
            && migrating["observedGeneration"] == live["metadata"]["generation"],
        "Kubernetes did not end the migration at the CRD's generation {} (so it did not trim): {migrating}",
        live["metadata"]["generation"]
    );
    wait_for(
        "storedVersions list v1alpha1 again and the migration is marked",
        Duration::from_secs(60),
        || async {
            let listed = api.of_resource(group, plural).await.map_err(|e| e.to_string())?;
            let marked = listed.migrations.iter().any(|m| m.name == first && m.restored);
            Ok(marked
                && env
                    .stored_versions(&crd.name)
                    .await?
                    .contains(&"v1alpha1".to_owned()))
        },
    )
    .await?;
    // A removal now due does not land.
    let (deprecate, _) = in_seconds(2);
    env.patch_policy(
        &name,
        json!({"spec": {"versions": [
            {"name": "v1alpha1", "deprecate": {"at": deprecate}, "unserve": {"after": "1s"}, "remove": {"after": "1s"}},
            {"name": "v1", "store": {"at": store}}]}}),
    )
    .await?;
    wait_for("v1alpha1 is unserved", Duration::from_secs(30), || async {
        Ok(env.flags(&crd.name).await?.starts_with("v1alpha1:d "))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let flags = env.flags(&crd.name).await?;
    ensure!(flags.starts_with("v1alpha1:"), "v1alpha1 was removed: {flags}");
    if let Some(counts) = crate::storage_flip::stored_as(env, &crd).await? {
        let old = format!("{}/v1alpha1", crd.group);
        ensure!(
            counts.get(&old).map(|(n, _)| *n) == Some(count),
            "etcd: {counts:?}"
        );
        println!("e2e: builtin_migration_fails: in etcd: {counts:?}");
    }
    let (_, _, message) = env.condition(&name, "Blocked").await?;
    println!("e2e: builtin_migration_fails: Blocked: {message}");
    Ok(())
}

/// The CRD as the apiserver has it (JSON) and its condition `StorageMigrating`, which
/// Kubernetes' migrator sets as a migration runs and ends.
async fn storage_migrating(env: &Env, crd: &str) -> Result<(serde_json::Value, serde_json::Value), String> {
    let request = http::Request::get(format!(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
    ))
    .body(Vec::new())
    .map_err(|e| e.to_string())?;
    let live: serde_json::Value = env.client.request(request).await.map_err(|e| e.to_string())?;
    let migrating = live["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "StorageMigrating")
        .cloned()
        .ok_or("the CRD has no StorageMigrating condition")?;
    Ok((live, migrating))
}
