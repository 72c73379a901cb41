//! `spec.migration.engine: StorageVersionMigration` on a server that serves
//! storagemigration.k8s.io (Kubernetes 1.35+ with the StorageVersionMigrator feature and
//! the kube-controller-manager's svm controller); elsewhere (1.24, or the API off) it skips
//! with one line.

use std::time::Duration;

use crd_lifecycle::migrate::builtin::{self, State};
use serde_json::json;

use crate::ensure;
use crate::env::{Env, Outcome, in_seconds, wait_for};

pub async fn builtin_migration(env: &Env) -> Outcome {
    let Some(api) = builtin::Migrations::discover(&env.client)
        .await
        .map_err(|e| format!("cannot discover storagemigration.k8s.io: {e}"))?
    else {
        println!("e2e: builtin_migration: SKIPPED: the server does not serve storagemigration.k8s.io");
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
