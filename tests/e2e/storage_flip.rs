//! Issue 29, scenarios 1 and 2 on a real control plane: the storage version flips away
//! and back (v2 -> v1 -> v2, v1 still in `storedVersions`) while objects are written, during
//! a migration (and during a failover), and after a finished built-in migration. Each ends
//! by proving that no object is left stored in a trimmed version: in etcd on the suite's own
//! control plane, and on any cluster by removing the
//! trimmed version from the CRD and reading every object through the one left (an object
//! still stored in a removed version cannot be read: the apiserver cannot convert it).
//!
//! The flip is made while the policy is suspended, so that the controller does not restore
//! the storage version before the writes land: as a GitOps tool re-applying an old CRD does
//! between two reconciles, only wider.

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DynamicObject;
use serde_json::{Value, json};

use crate::ensure;
use crate::env::{Env, Outcome, TestCrd, in_seconds, wait_for};

/// Objects created through v1 before the migration to v2.
const OBJECTS: usize = 1000;

/// Objects written while the storage version is v1 (the first in list order, so rewritten
/// by the migration before the flip, and before any checkpoint taken after it).
const WRITTEN_DURING_THE_FLIP: usize = 100;

/// A policy storing v2 in a few seconds (no preflight), its migration slow enough (20
/// objects a second) for a flip to land in it.
async fn migrating_policy(env: &Env, crd: &TestCrd, suffix: &str, engine: &str) -> Result<String, String> {
    let (store, _) = in_seconds(5);
    let name = format!("{}-{suffix}", env.run_id);
    env.create_policy(json!({
        "apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
        "metadata": {"name": name},
        "spec": {"crdName": crd.name,
                 "versions": [{"name": "v1"}, {"name": "v2", "store": {"at": store}}],
                 "migration": {"enabled": true, "engine": engine, "preflight": false,
                               "concurrency": 2, "pageSize": 100, "qps": 20}}}))
        .await?;
    Ok(name)
}

async fn suspend(env: &Env, policy: &str, suspended: bool) -> Outcome {
    env.policy_api()
        .patch(
            policy,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": suspended}})),
        )
        .await
        .map_err(|e| format!("cannot set spec.suspend of {policy}: {e}"))?;
    if suspended {
        wait_for(
            "the controller sees the policy suspended",
            Duration::from_secs(30),
            || async { Ok(env.condition(policy, "Blocked").await?.1 == "Suspended") },
        )
        .await?;
    }
    Ok(())
}

/// Makes `to` the storage version (as `kubectl apply` of a CRD that says so), then waits
/// until the apiserver stores in it (discovery's storageVersionHash, three answers in a row).
async fn switch_storage(env: &Env, crd: &TestCrd, to: &str) -> Outcome {
    let api: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let current = env.crd(&crd.name).await?;
    let ops: Vec<Value> = current
        .spec
        .versions
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"op": "replace", "path": format!("/spec/versions/{i}/storage"), "value": v.name == to}))
        .collect();
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).map_err(|e| e.to_string())?;
    api.patch(&crd.name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .map_err(|e| format!("cannot make {to} the storage version of {}: {e}", crd.name))?;
    let wanted = crd_lifecycle::migrate::storage_version_hash(&crd.group, to, "Widget");
    let agreeing = std::cell::Cell::new(0);
    wait_for(
        &format!("the apiserver stores {} as {to}", crd.name),
        Duration::from_secs(30),
        || {
            let wanted = wanted.clone();
            let agreeing = &agreeing;
            async move {
                let request = http::Request::get(format!("/apis/{}/{to}", crd.group))
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                let discovered: Value = env.client.request(request).await.map_err(|e| e.to_string())?;
                let hash = discovered["resources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|r| r["name"] == "widgets")
                    .and_then(|r| r["storageVersionHash"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                agreeing.set(if hash == wanted { agreeing.get() + 1 } else { 0 });
                Ok(agreeing.get() >= 3)
            }
        },
    )
    .await?;
    Ok(())
}

/// Writes the first `count` objects through `version` (a change of `spec.color`): the
/// apiserver stores each in the storage version of the moment.
async fn write_objects(env: &Env, crd: &TestCrd, version: &str, count: usize) -> Outcome {
    let resource = kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(&crd.group, version, "Widget"),
        "widgets",
    );
    let api: Api<DynamicObject> = Api::all_with(env.client.clone(), &resource);
    let written: Vec<Result<(), String>> = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("w{i:05}");
                api.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"color": "written-during-the-flip"}})),
                )
                .await
                .map(|_| ())
                .map_err(|e| format!("cannot write {name} through {version}: {e}"))
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    written.into_iter().collect()
}

/// How many objects etcd stores in each apiVersion (and the first few names), on the suite's
/// own control plane; `None` on a cluster whose etcd the suite cannot read.
pub async fn stored_as(
    env: &Env,
    crd: &TestCrd,
) -> Result<Option<std::collections::BTreeMap<String, (usize, Vec<String>)>>, String> {
    let Some(plane) = env.control_plane() else {
        return Ok(None);
    };
    let prefix = format!("/registry/{}/widgets/", crd.group);
    let mut counts = std::collections::BTreeMap::new();
    for (key, object) in plane.etcd().list(&prefix).await? {
        let api_version = object["apiVersion"].as_str().unwrap_or_default().to_owned();
        let entry: &mut (usize, Vec<String>) = counts.entry(api_version).or_default();
        entry.0 += 1;
        if entry.1.len() < 3 {
            entry.1.push(key.trim_start_matches(&prefix).to_owned());
        }
    }
    Ok(Some(counts))
}

/// Once `storedVersions` is trimmed to `[v2]`, no object is stored as v1.
async fn trimmed_with_nothing_left_in_v1(env: &Env, crd: &TestCrd, policy: &str) -> Outcome {
    wait_for(
        "storedVersions is trimmed to [v2]",
        Duration::from_secs(300),
        || async { Ok(env.stored_versions(&crd.name).await? == ["v2"]) },
    )
    .await?;
    nothing_left_in_v1(env, crd, policy).await
}

/// `storedVersions` is `[v2]` and no object is stored as v1: in etcd (where it can be read),
/// and after v1 is removed from the CRD (the policy deleted first), every object reads
/// through v2.
async fn nothing_left_in_v1(env: &Env, crd: &TestCrd, policy: &str) -> Outcome {
    ensure!(
        env.stored_versions(&crd.name).await? == ["v2"],
        "storedVersions {:?}",
        env.stored_versions(&crd.name).await?
    );
    if let Some(counts) = stored_as(env, crd).await? {
        let v1 = format!("{}/v1", crd.group);
        ensure!(
            !counts.contains_key(&v1),
            "objects stored as v1 in etcd after the trim: {counts:?}"
        );
        println!("e2e: in etcd after the trim: {counts:?}");
    }
    env.delete_policy(policy).await?;
    wait_for("the policy is released", Duration::from_secs(30), || async {
        Ok(!env.policy_exists(policy).await?)
    })
    .await?;
    let api: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/spec/versions/0/name", "value": "v1"},
        {"op": "remove", "path": "/spec/versions/0"},
    ]))
    .map_err(|e| e.to_string())?;
    api.patch(&crd.name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .map_err(|e| format!("cannot remove v1 from {}: {e}", crd.name))?;
    wait_for("v1 is no longer served", Duration::from_secs(30), || async {
        let (code, _, _) = env.get_via(crd, "v1", "w00000").await?;
        Ok(code == 404)
    })
    .await?;
    let mut unreadable = Vec::new();
    for i in 0..OBJECTS {
        let name = format!("w{i:05}");
        let (code, _, body) = env.get_via(crd, "v2", &name).await?;
        if code != 200 {
            unreadable.push(format!("{name}: {code} {}", body["message"]));
        }
    }
    ensure!(
        unreadable.is_empty(),
        "{} objects cannot be read once v1 is removed, e.g. {:?}",
        unreadable.len(),
        unreadable.iter().take(3).collect::<Vec<_>>()
    );
    let listed = env.list_via(crd, "v2").await?;
    ensure!(
        listed.len() == OBJECTS,
        "{} of {OBJECTS} objects listed",
        listed.len()
    );
    Ok(())
}

async fn rewritten(env: &Env, policy: &str) -> Result<u64, String> {
    Ok(env.policy(policy).await?["status"]["migration"]["rewritten"]
        .as_u64()
        .unwrap_or(0))
}

/// The flip itself: v2 -> v1, the first objects written (stored as v1), v1 -> v2.
async fn flip(env: &Env, crd: &TestCrd) -> Outcome {
    switch_storage(env, crd, "v1").await?;
    write_objects(env, crd, "v2", WRITTEN_DURING_THE_FLIP).await?;
    if let Some(counts) = stored_as(env, crd).await? {
        let v1 = counts.get(&format!("{}/v1", crd.group)).map_or(0, |c| c.0);
        ensure!(
            v1 >= WRITTEN_DURING_THE_FLIP,
            "the writes during the flip are stored as v1: {counts:?}"
        );
    }
    switch_storage(env, crd, "v2").await
}

/// Scenario 1: a migration from v1 to v2 during which the storage version flips to v1 and
/// back while objects it already rewrote are written.
pub async fn flip_during_a_migration(env: &Env) -> Outcome {
    let crd = env
        .create_crd("flip", &[("v1", true, true), ("v2", true, false)])
        .await?;
    env.create_objects(&crd, "v1", OBJECTS).await?;
    let policy = migrating_policy(env, &crd, "flip", "Internal").await?;
    wait_for(
        "the migration has rewritten the objects the flip writes",
        Duration::from_secs(120),
        || async { Ok(rewritten(env, &policy).await? >= 3 * WRITTEN_DURING_THE_FLIP as u64) },
    )
    .await?;
    suspend(env, &policy, true).await?;
    flip(env, &crd).await?;
    let migration = env.policy(&policy).await?["status"]["migration"].clone();
    ensure!(
        migration["phase"] == "Running",
        "the flip landed during the migration: {migration}"
    );
    suspend(env, &policy, false).await?;
    trimmed_with_nothing_left_in_v1(env, &crd, &policy).await
}

/// Scenario 1 across a failover: the controller is killed after a checkpoint, the flip
/// happens while no controller runs, and the next one resumes from the checkpoint.
pub async fn flip_during_a_failover(env: &Env) -> Outcome {
    if env.in_cluster {
        println!(
            "e2e: flip_during_a_failover: skipped in-cluster (the suite does not own the operator's pods)"
        );
        return Ok(());
    }
    let crd = env
        .create_crd("flipfail", &[("v1", true, true), ("v2", true, false)])
        .await?;
    env.create_objects(&crd, "v1", OBJECTS).await?;
    let policy = migrating_policy(env, &crd, "flipfail", "Internal").await?;
    wait_for(
        "a checkpoint after the objects the flip writes",
        Duration::from_secs(120),
        || async {
            let migration = env.policy(&policy).await?["status"]["migration"].clone();
            Ok(migration["checkpoint"]["rewritten"].as_u64().unwrap_or(0)
                >= 3 * WRITTEN_DURING_THE_FLIP as u64)
        },
    )
    .await?;
    env.kill_controller();
    let saved = env.policy(&policy).await?["status"]["migration"].clone();
    ensure!(saved["phase"] == "Running", "killed mid-run: {saved}");
    flip(env, &crd).await?;
    env.start_controller()?;
    trimmed_with_nothing_left_in_v1(env, &crd, &policy).await
}

/// How often `flip_after_a_builtin_migration` flips the storage version and re-migrates.
const FLIP_ROUNDS: u32 = 3;

/// Scenario 2: the built-in migration into v2 finished (and trimmed); then, `FLIP_ROUNDS`
/// times, the storage version flips to v1 and back while objects are written. The old
/// migration must not be followed: a new StorageVersionMigration rewrites them before
/// anything is trimmed, and etcd holds no object as v1 after each one concluded.
pub async fn flip_after_a_builtin_migration(env: &Env) -> Outcome {
    let Some(api) = crate::env::builtin_migrations(env, "flip_after_a_builtin_migration").await? else {
        return Ok(());
    };
    let crd = env
        .create_crd("flipsvm", &[("v1", true, true), ("v2", true, false)])
        .await?;
    env.create_objects(&crd, "v1", OBJECTS).await?;
    let policy = migrating_policy(env, &crd, "flipsvm", "StorageVersionMigration").await?;
    // The built-in controller is slow to start (sample 35: 82 s for 20 objects).
    wait_for(
        "the first built-in migration trims storedVersions to [v2]",
        Duration::from_secs(300),
        || async { Ok(env.stored_versions(&crd.name).await? == ["v2"]) },
    )
    .await?;
    wait_for(
        "status.migration says Succeeded",
        Duration::from_secs(30),
        || async { Ok(env.policy(&policy).await?["status"]["migration"]["phase"] == "Succeeded") },
    )
    .await?;
    // Finding 8: flipped and re-migrated several times, etcd checked after each migration.
    for round in 1..=FLIP_ROUNDS {
        let concluded = env.policy(&policy).await?["status"]["migration"]["finishedAt"].clone();
        suspend(env, &policy, true).await?;
        flip(env, &crd).await?;
        ensure!(
            env.stored_versions(&crd.name).await? == ["v2", "v1"],
            "round {round}: the flip stored v1 again: {:?}",
            env.stored_versions(&crd.name).await?
        );
        suspend(env, &policy, false).await?;
        // The next conclusion of the policy's migration. Not storedVersions: the built-in
        // controller trims it when it starts a migration (its server-side apply of the CRD's
        // status drops the version the flip stored), before it has migrated anything.
        wait_for(
            "the policy's migration concludes again",
            Duration::from_secs(300),
            || async {
                let migration = env.policy(&policy).await?["status"]["migration"].clone();
                Ok(migration["phase"] == "Succeeded" && migration["finishedAt"] != concluded)
            },
        )
        .await?;
        let migration = env.policy(&policy).await?["status"]["migration"].clone();
        if let Some(counts) = stored_as(env, &crd).await? {
            ensure!(
                !counts.contains_key(&format!("{}/v1", crd.group)),
                "round {round}: objects stored as v1 in etcd after {} concluded: {counts:?}",
                migration["storageVersionMigration"]
            );
            println!(
                "e2e: round {round}: in etcd after {}: {counts:?}",
                migration["storageVersionMigration"]
            );
        }
    }
    let (plural, group) = crd.name.split_once('.').unwrap_or_default();
    let ours: Vec<String> = api
        .of_resource(group, plural)
        .await
        .map_err(|e| e.to_string())?
        .migrations
        .into_iter()
        .filter(|m| m.policy.as_deref() == Some(policy.as_str()))
        .map(|m| m.name)
        .collect();
    // What the built-in migrator did, for the record.
    let request = http::Request::get("/apis/storagemigration.k8s.io/v1beta1/storageversionmigrations")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let listed: Value = env.client.request(request).await.map_err(|e| e.to_string())?;
    for svm in listed["items"].as_array().into_iter().flatten() {
        if ours.iter().any(|name| svm["metadata"]["name"] == name.as_str()) {
            println!(
                "e2e: {}: created for {}, listed at {}, {}",
                svm["metadata"]["name"],
                svm["metadata"]["annotations"]["crdlifecycle.io/crd-resource-version"],
                svm["status"]["resourceVersion"],
                svm["status"]["conditions"]
            );
        }
    }
    let migration = env.policy(&policy).await?["status"]["migration"].clone();
    let last = crd_lifecycle::migrate::builtin::migration_name(&crd.name, "v2", FLIP_ROUNDS + 1);
    ensure!(
        ours.len() == FLIP_ROUNDS as usize + 1
            && ours.last() == Some(&last)
            && migration["storageVersionMigration"] == last.as_str(),
        "a new StorageVersionMigration after each flip, the last followed to its end: {ours:?}, {migration}"
    );
    nothing_left_in_v1(env, &crd, &policy).await
}
