//! The end-to-end scenarios. Each asserts the cluster's actual state at each step.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use crate::ensure;
use crate::env::{Env, Outcome, in_seconds, wait_for};

/// How late a transition may land (the controller promises 2 s) plus polling slack.
const LANDING: Duration = Duration::from_millis(2_000 + 700);

fn policy(name: &str, crd: &str, versions: Value, migration: Value) -> Value {
    json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
           "metadata": {"name": name},
           "spec": {"crdName": crd, "versions": versions, "migration": migration}})
}

/// Waits until the CRD's flags read `expected`, checking it happened within the landing
/// time of `due`.
async fn expect_flags(env: &Env, crd: &str, expected: &str, due: Instant, step: &str) -> Outcome {
    let limit = due.saturating_duration_since(Instant::now()) + Duration::from_secs(20);
    let seen = wait_for(&format!("{step}: flags {expected}"), limit, || async {
        Ok(env.flags(crd).await? == expected)
    })
    .await?;
    let late = seen.saturating_duration_since(due);
    ensure!(late <= LANDING, "{step} landed {late:?} after its instant");
    Ok(())
}

/// introduce → store → deprecate (Warning header) → unserve (404) → remove, with status,
/// columns and events checked.
pub async fn full_lifecycle(env: &Env) -> Outcome {
    let crd = env
        .create_crd(
            "lifecycle",
            &[
                ("v1alpha1", true, true),
                ("v1beta1", true, false),
                ("v1", false, false),
            ],
        )
        .await?;
    env.create_objects(&crd, "v1alpha1", 10).await?;
    let (t0, due0) = in_seconds(10);
    let (t1, due1) = in_seconds(16);
    let (t2, due2) = in_seconds(22);
    let (t3, due3) = in_seconds(28);
    let (t4, due4) = in_seconds(34);
    let warning = format!("{}/v1alpha1 Widget is deprecated; use v1", crd.group);
    let name = format!("{}-lifecycle", env.run_id);
    env.create_policy(policy(
        &name,
        &crd.name,
        json!([
            {"name": "v1alpha1", "deprecate": {"at": t2, "warning": warning}, "unserve": {"at": t3}, "remove": {"at": t4}},
            {"name": "v1beta1", "deprecate": {"at": t2}},
            {"name": "v1", "introduce": {"at": t0}, "store": {"at": t1}},
        ]),
        json!({"enabled": true}),
    ))
    .await?;

    wait_for("the policy is reconciled", Duration::from_secs(15), || async {
        Ok(env.condition(&name, "Ready").await?.0 == "True")
    })
    .await?;
    let columns = env.policy_columns(&name).await?;
    ensure!(
        columns.iter().any(|(c, v)| c == "CRD" && *v == crd.name),
        "CRD column: {columns:?}"
    );
    ensure!(
        columns.iter().any(|(c, v)| c == "Storage" && v == "v1alpha1"),
        "Storage column: {columns:?}"
    );
    ensure!(
        columns
            .iter()
            .any(|(c, v)| c == "Next" && v.starts_with("v1 introduce")),
        "Next column: {columns:?}"
    );

    expect_flags(env, &crd.name, "v1alpha1:sS v1beta1:s v1:s", due0, "introduce").await?;
    expect_flags(env, &crd.name, "v1alpha1:s v1beta1:s v1:sS", due1, "store").await?;
    expect_flags(env, &crd.name, "v1alpha1:sd v1beta1:sd v1:sS", due2, "deprecate").await?;
    let (code, headers, _) = env.get_via(&crd, "v1alpha1", "w00001").await?;
    let header: Vec<String> = headers
        .get_all("warning")
        .iter()
        .filter_map(|h| h.to_str().ok().map(str::to_owned))
        .collect();
    ensure!(code == 200, "GET through deprecated v1alpha1: {code}");
    ensure!(
        header.iter().any(|h| h.contains(&warning)),
        "Warning header {header:?}"
    );

    expect_flags(env, &crd.name, "v1alpha1:d v1beta1:sd v1:sS", due3, "unserve").await?;
    let (code, _, _) = env.get_via(&crd, "v1alpha1", "w00001").await?;
    ensure!(code == 404, "GET through unserved v1alpha1 answered {code}");

    // The migration after `store` trimmed storedVersions long before, so the removal lands.
    expect_flags(env, &crd.name, "v1beta1:sd v1:sS", due4, "remove").await?;
    let (code, _, body) = env.get_via(&crd, "v1", "w00001").await?;
    ensure!(
        code == 200 && body["spec"]["size"] == 1,
        "object readable through v1: {code} {body}"
    );

    let status = env.policy(&name).await?["status"].clone();
    let phases: Vec<String> = status["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            format!(
                "{}={}",
                v["name"].as_str().unwrap_or_default(),
                v["phase"].as_str().unwrap_or_default()
            )
        })
        .collect();
    ensure!(
        phases == ["v1beta1=Deprecated", "v1=Stored", "v1alpha1=Removed"],
        "phases {phases:?}"
    );
    ensure!(
        env.condition(&name, "Ready").await?.0 == "True",
        "Ready at the end"
    );
    // kstatus: idle and healthy, nothing reconciling or stalled; `kubectl wait` agrees.
    ensure!(
        env.condition(&name, "Reconciling").await?.0 == "False"
            && env.condition(&name, "Stalled").await?.0 == "False",
        "neither Reconciling nor Stalled at the end"
    );
    env.kubectl_wait_ready(&name).await?;
    let columns = env.policy_columns(&name).await?;
    ensure!(
        columns.iter().any(|(c, v)| c == "Migration" && v == "10/10"),
        "Migration column: {columns:?}"
    );
    let reasons = env.event_reasons(&name).await?;
    for reason in [
        "VersionIntroduced",
        "StorageVersionChanged",
        "VersionDeprecated",
        "VersionUnserved",
        "VersionRemoved",
        "MigrationSucceeded",
    ] {
        ensure!(
            reasons.iter().any(|r| r == reason),
            "event {reason} missing from {reasons:?}"
        );
    }
    Ok(())
}

/// Thousands of objects in the old storage version: after `store` every object is
/// rewritten, storedVersions is trimmed only after that, then the old version goes.
pub async fn migration(env: &Env) -> Outcome {
    let count: usize = std::env::var("E2E_OBJECTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let crd = env
        .create_crd("migration", &[("v1alpha1", true, true), ("v1", true, false)])
        .await?;
    let created = env.create_objects(&crd, "v1alpha1", count).await?;
    let (store, _) = in_seconds(5);
    let (deprecate, _) = in_seconds(6);
    let name = format!("{}-migration", env.run_id);
    env.create_policy(policy(
        &name,
        &crd.name,
        json!([
            {"name": "v1alpha1", "deprecate": {"at": deprecate}, "unserve": {"after": "2s"}, "remove": {"after": "2s"}},
            {"name": "v1", "store": {"at": store}},
        ]),
        json!({"enabled": true, "concurrency": 16, "pageSize": 200}),
    ))
    .await?;

    let limit = Duration::from_secs(60 + (count as u64) / 20);
    wait_for("storedVersions is trimmed to [v1]", limit, || async {
        Ok(env.stored_versions(&crd.name).await? == ["v1"])
    })
    .await?;
    // Every object was rewritten before the trim: each has a new resourceVersion.
    let objects = env.list_via(&crd, "v1").await?;
    ensure!(
        objects.len() == count,
        "{} objects listed, {count} created",
        objects.len()
    );
    let before: std::collections::HashMap<&str, &str> =
        created.iter().map(|(n, rv)| (n.as_str(), rv.as_str())).collect();
    let untouched = objects
        .iter()
        .filter(|o| {
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            before.get(name).copied() == o["metadata"]["resourceVersion"].as_str()
        })
        .count();
    ensure!(
        untouched == 0,
        "{untouched} objects were not rewritten before the trim"
    );

    wait_for("v1alpha1 is removed", Duration::from_secs(30), || async {
        Ok(env.flags(&crd.name).await? == "v1:sS")
    })
    .await?;
    let migration = env.policy(&name).await?["status"]["migration"].clone();
    ensure!(migration["phase"] == "Succeeded", "migration status {migration}");
    ensure!(
        migration["rewritten"].as_u64().unwrap_or(0) + migration["skipped"].as_u64().unwrap_or(0)
            == count as u64,
        "{migration}"
    );
    Ok(())
}

/// Invalid policies are rejected by the apiserver where it evaluates CEL, and always
/// reported Blocked(InvalidPolicy) without touching the CRD; a missing CRD blocks until it
/// appears; a concurrent manual edit of the CRD is kept.
pub async fn bad_input(env: &Env) -> Outcome {
    let crd = env
        .create_crd("badinput", &[("v1alpha1", true, true), ("v1", true, false)])
        .await?;
    let before = env.crd(&crd.name).await?.metadata.resource_version;

    // Both `at` and `after`: CEL rejects it at admission on 1.25+. It governs a CRD of its
    // own: on a server without CEL it is accepted, and as the older policy of a shared CRD
    // it would make the next one a `Conflict` instead of `InvalidPolicy`.
    let cel_crd = env
        .create_crd("badinput-cel", &[("v1alpha1", true, true), ("v1", true, false)])
        .await?;
    let both = policy(
        &format!("{}-cel", env.run_id),
        &cel_crd.name,
        json!([{"name": "v1", "store": {"at": "2026-01-01T00:00:00Z", "after": "1d"}}]),
        json!({"enabled": false}),
    );
    let created = env.create_policy(both).await;
    if env.has_cel() {
        let message = created.err().unwrap_or_default();
        ensure!(
            message.contains("exactly one of at or after must be set"),
            "CEL rejection: {message}"
        );
    } else {
        ensure!(created.is_ok(), "a 1.21-1.24 server accepts it: {created:?}");
        let name = format!("{}-cel", env.run_id);
        wait_for("Blocked(InvalidPolicy)", Duration::from_secs(20), || async {
            Ok(env.condition(&name, "Blocked").await?.1 == "InvalidPolicy")
        })
        .await?;
    }

    // Valid for the schema, invalid for the engine: unserving the storage version.
    let name = format!("{}-invalid", env.run_id);
    env.create_policy(policy(
        &name,
        &crd.name,
        json!([{"name": "v1alpha1", "deprecate": {"at": "2026-01-01T00:00:00Z"}, "unserve": {"at": "2026-01-02T00:00:00Z"}}]),
        json!({"enabled": false}),
    ))
    .await?;
    wait_for("Blocked(InvalidPolicy)", Duration::from_secs(20), || async {
        let (status, reason, message) = env.condition(&name, "Blocked").await?;
        Ok(status == "True" && reason == "InvalidPolicy" && message.contains("spec.versions[0].unserve"))
    })
    .await?;
    ensure!(
        env.crd(&crd.name).await?.metadata.resource_version == before,
        "the CRD was touched"
    );

    // A policy for a CRD that does not exist yet.
    let missing_group = format!("{}-later.e2e.crdlifecycle.test", env.run_id);
    let missing_name = format!("widgets.{missing_group}");
    let later = format!("{}-later", env.run_id);
    let (introduce, _) = in_seconds(1);
    let (deprecate, due) = in_seconds(15);
    env.create_policy(policy(
        &later,
        &missing_name,
        json!([{"name": "v1alpha1", "deprecate": {"at": deprecate}}, {"name": "v1", "introduce": {"at": introduce}}]),
        json!({"enabled": false}),
    ))
    .await?;
    wait_for("Blocked(CRDNotFound)", Duration::from_secs(20), || async {
        Ok(env.condition(&later, "Blocked").await?.1 == "CRDNotFound")
    })
    .await?;
    let appeared = env
        .create_crd("later", &[("v1alpha1", true, true), ("v1", false, false)])
        .await?;
    ensure!(
        appeared.name == missing_name,
        "names: {} vs {missing_name}",
        appeared.name
    );
    wait_for("the late CRD is governed", Duration::from_secs(20), || async {
        Ok(env.flags(&missing_name).await? == "v1alpha1:sS v1:s")
    })
    .await?;

    // A manual edit of the CRD (a label and a printer column) survives the next transition.
    let api: kube::Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = kube::Api::all(env.client.clone());
    let patch = json!([
        {"op": "add", "path": "/metadata/labels/team", "value": "widgets"},
        {"op": "add", "path": "/spec/versions/0/additionalPrinterColumns",
         "value": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}]},
    ]);
    let patch: json_patch::Patch = serde_json::from_value(patch).map_err(|e| e.to_string())?;
    api.patch(
        &missing_name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Json::<()>(patch),
    )
    .await
    .map_err(|e| e.to_string())?;
    expect_flags(
        env,
        &missing_name,
        "v1alpha1:sSd v1:s",
        due,
        "deprecate after a manual edit",
    )
    .await?;
    let edited = env.crd(&missing_name).await?;
    ensure!(
        edited
            .metadata
            .labels
            .unwrap_or_default()
            .get("team")
            .map(String::as_str)
            == Some("widgets"),
        "the manual label was clobbered"
    );
    ensure!(
        edited.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .is_some_and(|c| c.len() == 1),
        "the manual printer column was clobbered"
    );
    Ok(())
}

/// Killing the controller during a migration and starting it again finishes the
/// migration with every object rewritten.
pub async fn restart(env: &Env) -> Outcome {
    if env.in_cluster {
        println!("e2e: restart: skipped in-cluster (the suite does not own the operator's pods)");
        return Ok(());
    }
    let count: usize = std::env::var("E2E_OBJECTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000)
        .max(1000);
    let crd = env
        .create_crd("restart", &[("v1alpha1", true, true), ("v1", true, false)])
        .await?;
    env.create_objects(&crd, "v1alpha1", count).await?;
    let (store, _) = in_seconds(3);
    let name = format!("{}-restart", env.run_id);
    env.create_policy(policy(
        &name,
        &crd.name,
        json!([{"name": "v1", "store": {"at": store}}]),
        // Slow on purpose, so that the kill lands mid-run.
        json!({"enabled": true, "concurrency": 2, "pageSize": 50, "qps": 100}),
    ))
    .await?;
    wait_for("a checkpoint is saved", Duration::from_secs(60), || async {
        let migration = env.policy(&name).await?["status"]["migration"].clone();
        Ok(migration["checkpoint"]["continueToken"].is_string())
    })
    .await?;
    env.kill_controller();
    let saved = env.policy(&name).await?["status"]["migration"].clone();
    ensure!(saved["phase"] == "Running", "killed mid-run: {saved}");
    ensure!(
        env.stored_versions(&crd.name).await? != ["v1"],
        "not trimmed before the end"
    );
    env.start_controller()?;
    wait_for(
        "the resumed migration succeeds",
        Duration::from_secs(120 + count as u64 / 50),
        || async { Ok(env.policy(&name).await?["status"]["migration"]["phase"] == "Succeeded") },
    )
    .await?;
    ensure!(env.stored_versions(&crd.name).await? == ["v1"], "trimmed");
    let objects = env.list_via(&crd, "v1").await?;
    ensure!(objects.len() == count, "{} of {count} objects", objects.len());
    let reasons = env.event_reasons(&name).await?;
    ensure!(
        reasons.iter().any(|r| r == "MigrationResumed"),
        "resumed, events: {reasons:?}"
    );
    Ok(())
}

/// Gates on a real apiserver: an approval holds a `store` until the annotation names it
/// (after a conversion preflight has passed), and a traffic gate holds an `unserve` while
/// a client keeps calling the version.
pub async fn gates(env: &Env) -> Outcome {
    let crd = env
        .create_crd("gates", &[("v1alpha1", true, true), ("v1", true, false)])
        .await?;
    env.create_objects(&crd, "v1alpha1", 20).await?;
    let (store, _) = in_seconds(3);
    let (deprecate, _) = in_seconds(4);
    let (unserve, _) = in_seconds(6);
    let name = format!("{}-gates", env.run_id);
    env.create_policy(policy(
        &name,
        &crd.name,
        json!([
            {"name": "v1", "store": {"at": store, "approval": "Required"}},
            {"name": "v1alpha1", "deprecate": {"at": deprecate},
             "unserve": {"at": unserve, "requireNoTrafficFor": "8s"}},
        ]),
        json!({"enabled": true}),
    ))
    .await?;
    wait_for(
        "the store waits for approval",
        Duration::from_secs(30),
        || async { Ok(env.condition(&name, "Blocked").await?.1 == "AwaitingApproval") },
    )
    .await?;
    ensure!(
        env.flags(&crd.name).await?.starts_with("v1alpha1:sS"),
        "storage unchanged while held"
    );
    let message = env.condition(&name, "Blocked").await?.2;
    ensure!(message.contains("crdlifecycle.io/approve=v1.store"), "{message}");

    // A client keeps calling v1alpha1 while the approval is given.
    let client = env.clone_client();
    let crd_for_client = crate::env::TestCrd {
        name: crd.name.clone(),
        group: crd.group.clone(),
    };
    let caller = tokio::spawn(async move {
        for _ in 0..30 {
            let request =
                http::Request::get(format!("/apis/{}/v1alpha1/widgets/w00001", crd_for_client.group))
                    .body(Vec::new())
                    .expect("request");
            let _ = client.request_text(request).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let api: kube::Api<kube::core::DynamicObject> = kube::Api::all_with(
        env.client.clone(),
        &kube::discovery::ApiResource {
            group: "crdlifecycle.io".into(),
            version: "v1alpha1".into(),
            api_version: "crdlifecycle.io/v1alpha1".into(),
            kind: "VersionPolicy".into(),
            plural: "versionpolicies".into(),
        },
    );
    let patch = json!({"metadata": {"annotations": {"crdlifecycle.io/approve": "v1.store"}}});
    api.patch(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .map_err(|e| e.to_string())?;
    wait_for(
        "the approved store lands (after its preflight)",
        Duration::from_secs(60),
        || async { Ok(env.flags(&crd.name).await?.contains("v1:sS")) },
    )
    .await?;
    let status = env.policy(&name).await?["status"].clone();
    let preflight = status["preflights"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["version"] == "v1")
        .cloned()
        .unwrap_or_default();
    ensure!(
        preflight["phase"] == "Succeeded",
        "preflight: {}",
        status["preflights"]
    );
    // The status is written just after the CRD patch: wait for the history entry rather
    // than read it the moment the flags change.
    wait_for(
        "the approval is recorded in history",
        Duration::from_secs(20),
        || async {
            let status = env.policy(&name).await?["status"].clone();
            Ok(status["history"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|h| h["milestone"] == "store" && h["approvedBy"].is_string()))
        },
    )
    .await?;

    wait_for(
        "the unserve waits for the client",
        Duration::from_secs(20),
        || async { Ok(env.condition(&name, "Blocked").await?.1 == "VersionInUse") },
    )
    .await?;
    ensure!(
        env.flags(&crd.name).await?.starts_with("v1alpha1:sd"),
        "still served while called"
    );
    caller.await.map_err(|e| e.to_string())?;
    wait_for(
        "the quiet version stops being served",
        Duration::from_secs(60),
        || async { Ok(env.flags(&crd.name).await?.starts_with("v1alpha1:d")) },
    )
    .await?;
    let traffic = env.policy(&name).await?["status"]["traffic"][0].clone();
    ensure!(traffic["lastRequestAt"].is_string(), "traffic status {traffic}");
    Ok(())
}

/// The policy's conversion between v1alpha1, v1beta1 and v1 of `conversion_webhook` and the
/// soak: a rename, an added default, a removed field, a nested move and a CEL type change.
pub fn conversion() -> Value {
    json!({
        "webhook": {"enabled": true},
        "changes": [
            {"from": "v1alpha1", "to": "v1beta1",
             "renamed": [{"from": "spec.size", "to": "spec.replicas"}],
             "added": [{"path": "spec.color", "default": "blue"}],
             "removed": ["spec.legacyMode"]},
            {"from": "v1beta1", "to": "v1", "renamed": [{"from": "spec.replicas", "to": "spec.scale.replicas"}],
             "changed": [{"path": "spec.port", "upgrade": "int(self)", "downgrade": "string(self)"}]},
        ]
    })
}

/// Conversion through the operator's declarative webhook: thousands of objects stored as
/// v1alpha1 are migrated through the webhook into v1, and every object then reads, with
/// identical data, through every served version.
pub async fn conversion_webhook(env: &Env) -> Outcome {
    let count: usize = std::env::var("E2E_OBJECTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let crd = env
        .create_crd(
            "conversion",
            &[
                ("v1alpha1", true, true),
                ("v1beta1", true, false),
                ("v1", true, false),
            ],
        )
        .await?;
    // Objects as v1alpha1: {size, legacyMode, port}; port is a string until v1beta1 and an
    // integer in v1 (a CEL type change), and every third one is zero-padded ("08003"), a
    // value the round trip through v1 alone would not give back.
    let port = |i: usize| {
        let number = 8000 + i % 100;
        if i.is_multiple_of(3) {
            format!("0{number}")
        } else {
            number.to_string()
        }
    };
    futures::stream::iter(0..count)
        .map(|i| {
            let body = json!({"apiVersion": format!("{}/v1alpha1", crd.group), "kind": "Widget",
                              "metadata": {"name": format!("g{i:05}")},
                              "spec": {"size": i, "legacyMode": i.is_multiple_of(2), "port": port(i)}});
            let request = http::Request::post(format!("/apis/{}/v1alpha1/widgets", crd.group))
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body).unwrap_or_default());
            async move {
                let request = request.map_err(|e| e.to_string())?;
                env.client
                    .request::<Value>(request)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<Result<(), String>>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, String>>()?;
    let (store, _) = in_seconds(8);
    let name = format!("{}-conversion", env.run_id);
    let mut object = policy(
        &name,
        &crd.name,
        json!([{"name": "v1", "store": {"at": store}}]),
        json!({"enabled": true, "concurrency": 16, "pageSize": 250}),
    );
    object["spec"]["conversion"] = conversion();
    env.create_policy(object).await?;
    wait_for(
        "the CRD converts through the webhook",
        Duration::from_secs(60),
        || async {
            let crd = env.crd(&crd.name).await?;
            Ok(crd.spec.conversion.is_some_and(|c| c.strategy == "Webhook"))
        },
    )
    .await?;
    let limit = Duration::from_secs(120 + (count as u64) / 10);
    wait_for("every object is migrated through the webhook", limit, || async {
        Ok(env.stored_versions(&crd.name).await? == ["v1"])
    })
    .await?;
    for version in ["v1alpha1", "v1beta1", "v1"] {
        let objects = env.list_via(&crd, version).await?;
        ensure!(
            objects.len() == count,
            "{} objects through {version}, {count} created",
            objects.len()
        );
        for object in &objects {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let i: usize = name.trim_start_matches('g').parse().unwrap_or(usize::MAX);
            let expected = match version {
                "v1alpha1" => json!({"size": i, "legacyMode": i.is_multiple_of(2), "port": port(i)}),
                "v1beta1" => json!({"replicas": i, "color": "blue", "port": port(i)}),
                _ => json!({"scale": {"replicas": i}, "color": "blue", "port": 8000 + i % 100}),
            };
            ensure!(
                object["spec"] == expected,
                "{name} through {version}: {} (expected {expected})",
                object["spec"]
            );
        }
    }

    // Deleting the policy leaves every served version readable: the CRD keeps converting
    // through the webhook, from the conversion recorded on it.
    env.delete_policy(&name).await?;
    wait_for(
        "the policy releases its CRD and goes",
        Duration::from_secs(30),
        || async { Ok(!env.policy_exists(&name).await?) },
    )
    .await?;
    for version in ["v1alpha1", "v1beta1", "v1"] {
        let objects = env.list_via(&crd, version).await?;
        ensure!(
            objects.len() == count,
            "after the policy was deleted: {} objects through {version}, {count} created",
            objects.len()
        );
    }
    Ok(())
}

/// Server-side apply through the old version, the whole lifecycle to its removal, then
/// server-side apply through the new version: it must work (without the managedFields
/// cleanup every apply answers 500, apiserver-samples/29).
pub async fn managed_fields(env: &Env) -> Outcome {
    let crd = env
        .create_crd("managedfields", &[("v1alpha1", true, true), ("v1", true, false)])
        .await?;
    for i in 0..5 {
        env.apply_via(&crd, "v1alpha1", &format!("m{i}"), json!({"size": i}), "gitops")
            .await?;
    }
    let (store, _) = in_seconds(4);
    let (deprecate, _) = in_seconds(6);
    let (unserve, _) = in_seconds(8);
    let (remove, due) = in_seconds(10);
    let name = format!("{}-managedfields", env.run_id);
    env.create_policy(policy(
        &name,
        &crd.name,
        json!([
            {"name": "v1alpha1", "deprecate": {"at": deprecate}, "unserve": {"at": unserve}, "remove": {"at": remove}},
            {"name": "v1", "store": {"at": store}},
        ]),
        json!({"enabled": true, "preflight": false}),
    ))
    .await?;
    let limit = due.saturating_duration_since(Instant::now()) + Duration::from_secs(90);
    wait_for(
        "v1alpha1 is removed after its managedFields cleanup",
        limit,
        || async { Ok(env.flags(&crd.name).await? == "v1:sS") },
    )
    .await?;
    // Once v1alpha1 is gone, one more cleanup runs, after no apiserver serves it (an entry
    // written through it after the first would break server-side apply): it succeeds, and
    // records v1alpha1 as cleaned while gone.
    wait_for(
        "the cleanup after the removal succeeds",
        Duration::from_secs(60),
        || async {
            let cleanup = env.policy(&name).await?["status"]["managedFieldsCleanup"].clone();
            Ok(cleanup["phase"] == "Succeeded" && cleanup["goneVersions"] == json!(["v1alpha1"]))
        },
    )
    .await?;
    let cleanup = env.policy(&name).await?["status"]["managedFieldsCleanup"].clone();
    ensure!(
        cleanup["phase"] == "Succeeded" && cleanup["versions"] == json!(["v1alpha1"]),
        "cleanup: {cleanup}"
    );
    for i in 0..5 {
        let applied = env
            .apply_via(&crd, "v1", &format!("m{i}"), json!({"size": i + 10}), "gitops")
            .await?;
        let entries = applied["metadata"]["managedFields"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ensure!(
            entries
                .iter()
                .all(|e| e["apiVersion"] != format!("{}/v1alpha1", crd.group)),
            "m{i} still names v1alpha1: {entries:?}"
        );
    }
    Ok(())
}
