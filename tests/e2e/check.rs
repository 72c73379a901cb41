//! `crd-lifecycle check` and `check --fix` on a real apiserver: a Flux-like upgrade that
//! drops a stored version and a rollback after the storage version moved forward, each with
//! the operator the release replaces writing through the old version a second before (named
//! with `--replaced-manager`: exit 0); a writer the release does not replace, through a
//! version being unserved or dropped (exit 1, the fix done all the same); a schema that
//! tightens under stored objects; and `check --fix` as the least-privilege ServiceAccount of
//! the upgrade examples.

use std::process::Output;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::control_plane::client_of;
use crate::ensure;
use crate::env::{Env, Outcome, TestCrd};

/// Runs `crd-lifecycle check ARGS` against the suite's cluster (`kubeconfig`, else the
/// suite's own).
async fn run_check(env: &Env, kubeconfig: Option<&std::path::Path>, args: &[&str]) -> Result<Output, String> {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"));
    match kubeconfig {
        Some(path) => {
            command.env("KUBECONFIG", path);
        }
        None => {
            env.with_kubeconfig(&mut command);
        }
    }
    command.arg("check").args(args);
    tokio::task::spawn_blocking(move || command.output())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot run crd-lifecycle check: {e}"))
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `kubectl apply --server-side` of a manifest, as a chart upgrade applies its CRDs.
async fn kubectl_apply(env: &Env, path: &std::path::Path) -> Result<Output, String> {
    let mut command = std::process::Command::new("kubectl");
    env.with_kubeconfig(&mut command);
    command
        .args([
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=helm",
            "-f",
        ])
        .arg(path);
    tokio::task::spawn_blocking(move || command.output())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot run kubectl: {e}"))
}

/// The live CRD as a release would ship it (no status, no server-set metadata), with its
/// versions replaced, written to a file of this run.
async fn incoming(
    env: &Env,
    crd: &TestCrd,
    file: &str,
    versions: Value,
) -> Result<std::path::PathBuf, String> {
    let live = serde_json::to_value(env.crd(&crd.name).await?).map_err(|e| e.to_string())?;
    let manifest = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": crd.name, "labels": live["metadata"]["labels"]},
        "spec": {"group": live["spec"]["group"], "names": live["spec"]["names"], "scope": live["spec"]["scope"],
                 "versions": versions},
    });
    let path = std::env::temp_dir().join(format!("{}-{file}.yaml", env.run_id));
    let yaml = format!(
        "# a release's CRDs\n{manifest}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: other}}\n"
    );
    std::fs::write(&path, yaml).map_err(|e| e.to_string())?;
    Ok(path)
}

/// The release's CRD (the first document of its file).
fn release_crd(release: &std::path::Path) -> Result<Value, String> {
    serde_saphyr::from_multiple::<Value>(&std::fs::read_to_string(release).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or_else(|| "no CRD in the release".to_owned())
}

/// What `check` asks where a stored version is missing: a dry run (`dryRun=All`) of
/// updating the CRD to the release's, at the live resourceVersion, sent by `client`. The
/// status code and the body.
async fn dry_run_update(
    env: &Env,
    client: kube::Client,
    crd: &TestCrd,
    release: &std::path::Path,
) -> Result<(u16, Value), String> {
    let mut manifest = release_crd(release)?;
    manifest["metadata"]["resourceVersion"] = json!(env.crd(&crd.name).await?.metadata.resource_version);
    let request = http::Request::put(format!(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{}?dryRun=All&fieldManager=crd-lifecycle-check",
        crd.name
    ))
    .header("content-type", "application/json")
    .body(kube::client::Body::from(manifest.to_string().into_bytes()))
    .map_err(|e| e.to_string())?;
    let response = client.send(request).await.map_err(|e| e.to_string())?;
    let code = response.status().as_u16();
    let body = response
        .into_body()
        .collect_bytes()
        .await
        .map_err(|e| e.to_string())?;
    Ok((code, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

fn open_version(name: &str, served: bool, storage: bool) -> Value {
    json!({"name": name, "served": served, "storage": storage,
           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
               "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}})
}

/// A guarded JSON Patch of the CRD (as a chart or the controller changes it).
async fn patch_crd(env: &Env, name: &str, ops: Value) -> Outcome {
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(|e| e.to_string())?;
    Api::<CustomResourceDefinition>::all(env.clone_client())
        .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map(|_| ())
        .map_err(|e| format!("patching {name}: {e}"))
}

/// Moves the storage version from index `from` to index `to` of `spec.versions`, and waits
/// until the apiserver stores in it (discovery's storageVersionHash, sample 26).
async fn switch_storage(env: &Env, crd: &TestCrd, from: usize, to: usize) -> Outcome {
    patch_crd(
        env,
        &crd.name,
        json!([
            {"op": "replace", "path": format!("/spec/versions/{from}/storage"), "value": false},
            {"op": "replace", "path": format!("/spec/versions/{to}/storage"), "value": true},
        ]),
    )
    .await?;
    // Objects written from now on must be stored in the new version.
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

/// Every object's `spec` by name, read through `version`.
async fn specs(env: &Env, crd: &TestCrd, version: &str) -> Result<Vec<(String, Value)>, String> {
    let mut specs: Vec<(String, Value)> = env
        .list_via(crd, version)
        .await?
        .into_iter()
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
                o["spec"].clone(),
            )
        })
        .collect();
    specs.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(specs)
}

/// The version each object is stored as in etcd (only on the suite's own control plane).
async fn stored_as(env: &Env, crd: &TestCrd, names: &[String]) -> Result<Option<Vec<String>>, String> {
    let Some(plane) = env.control_plane() else {
        return Ok(None);
    };
    let mut versions = Vec::new();
    for name in names {
        let key = format!("/registry/{}/widgets/{name}", crd.group);
        let stored = plane
            .etcd()
            .get(&key)
            .await?
            .ok_or_else(|| format!("{key} is not in etcd"))?;
        versions.push(stored["apiVersion"].as_str().unwrap_or_default().to_owned());
    }
    versions.sort();
    versions.dedup();
    Ok(Some(versions))
}

/// The field manager of the operator a release replaces: it writes its Widgets through the
/// version the release drops until the upgrade replaces it.
const OPERATOR: &str = "widgets-operator";

/// `manager` server-side applies `spec` to the objects `names` through `version` (the same
/// spec each time: nothing changes but its managedFields entries' time), then a second
/// passes: a writer as active as can be.
async fn write_a_second_before(
    env: &Env,
    crd: &TestCrd,
    version: &str,
    names: std::ops::Range<usize>,
    manager: &str,
) -> Outcome {
    for i in names {
        env.apply_via(
            crd,
            version,
            &format!("w{i:05}"),
            json!({"size": i, "owner": manager}),
            manager,
        )
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

/// Objects stored in v1beta1, the storage moved to v1, the new release drops v1beta1, and
/// the operator it replaces wrote through v1beta1 a second before: `check` exits 1 naming
/// the stored version in the apiserver's words and the writer, `kubectl apply` of the release
/// fails the same way, `check --fix --replaced-manager widgets-operator` (the writer still
/// writing a second before) exits 0 with every object rewritten and storedVersions trimmed,
/// the apply then succeeds, every object reads back unchanged, and server-side apply by the
/// old manager still works.
pub async fn flux_upgrade(env: &Env) -> Outcome {
    let crd = env
        .create_crd("chk-flux", &[("v1beta1", true, true), ("v1", true, false)])
        .await?;
    let count = 60;
    // Created through v1, stored as v1beta1 (the storage version then): the only writer
    // through v1beta1 is the operator.
    env.create_objects(&crd, "v1", count).await?;
    switch_storage(env, &crd, 0, 1).await?;
    ensure!(
        env.stored_versions(&crd.name).await? == ["v1beta1", "v1"],
        "storedVersions after the switch"
    );
    let release = incoming(env, &crd, "flux-release", json!([open_version("v1", true, true)])).await?;
    let file = release.display().to_string();
    write_a_second_before(env, &crd, "v1beta1", 0..10, OPERATOR).await?;

    let output = run_check(env, None, &["-f", &file]).await?;
    let report = text(&output);
    ensure!(output.status.code() == Some(1), "check exits 1: {report}");
    ensure!(
        report.contains("ActiveWriters v1beta1") && report.contains(&format!("{OPERATOR} (last write ")),
        "names the writer: {report}"
    );
    let wording = crd_lifecycle::lifecycle::apiserver_rules::stored_version_rejection(
        0,
        "v1beta1",
        Some(env.server_version),
    );
    ensure!(
        report.contains("StoredVersionMissing v1beta1") && report.contains(&wording),
        "names v1beta1 in the apiserver's words ({wording}): {report}"
    );
    ensure!(
        report.contains("ManagedFieldsNameDroppedVersion v1beta1"),
        "names the managedFields entries: {report}"
    );

    // check asked the apiserver: a dry run of the update answers in the words check quoted
    // (recorded in tests/fixtures/apiserver/crd-dry-run-update-rejected-v1.36.txt), the
    // status kept although the release's CRD has none, and nothing changes.
    let unchanged = env.crd(&crd.name).await?.metadata.resource_version;
    let (code, answer) = dry_run_update(env, env.clone_client(), &crd, &release).await?;
    println!("e2e: check_flux_upgrade: a dry run of the update answered {code}: {answer}");
    ensure!(
        code == 422
            && answer["details"]["causes"][0]["field"] == "status.storedVersions[0]"
            && answer["message"].as_str().is_some_and(|m| m.ends_with(&wording)),
        "a dry run is refused in the words check quoted ({wording}): {code} {answer}"
    );
    ensure!(
        env.crd(&crd.name).await?.metadata.resource_version == unchanged,
        "a dry run changes nothing"
    );

    // The apply fails as check said, in the same words: the apiserver's answer to the
    // server-side apply a chart upgrade sends (recorded in
    // tests/fixtures/apiserver/crd-remove-stored-version-rejected-v1.36.txt), and kubectl's.
    let manifest = release_crd(&release)?;
    let request = http::Request::patch(format!(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{}?fieldManager=helm&force=true",
        crd.name
    ))
    .header("content-type", "application/apply-patch+yaml")
    .body(kube::client::Body::from(manifest.to_string().into_bytes()))
    .map_err(|e| e.to_string())?;
    let response = env
        .clone_client()
        .send(request)
        .await
        .map_err(|e| e.to_string())?;
    let code = response.status().as_u16();
    let body = response
        .into_body()
        .collect_bytes()
        .await
        .map_err(|e| e.to_string())?;
    let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    ensure!(
        code == 422 && answer["message"].as_str().is_some_and(|m| m.contains(&wording)),
        "the apiserver refuses the release's CRD in the words check quoted: {code} {answer}"
    );
    println!("e2e: check_flux_upgrade: the apiserver answered {code}: {answer}");
    match kubectl_apply(env, &release).await {
        Ok(applied) if applied.status.success() => {
            return Err(format!("the apply succeeded: {}", text(&applied)));
        }
        Ok(applied) => {
            let said = text(&applied);
            ensure!(
                said.contains(&wording),
                "kubectl apply fails in the words check quoted: {said}"
            );
            println!("e2e: check_flux_upgrade: kubectl apply refused as expected");
        }
        Err(error) if error.contains("No such file") => println!("e2e: no kubectl: the apply is not tried"),
        Err(error) => return Err(error),
    }
    let before = specs(env, &crd, "v1").await?;
    ensure!(before.len() == count, "{} objects", before.len());

    write_a_second_before(env, &crd, "v1beta1", 0..10, OPERATOR).await?;
    let output = run_check(env, None, &["--fix", "-f", &file, "--replaced-manager", OPERATOR]).await?;
    let report = text(&output);
    ensure!(
        output.status.code() == Some(0),
        "check --fix naming the replaced writer exits 0: {report}"
    );
    ensure!(
        report.contains("check --fix ") && report.contains("rewriting every object into v1"),
        "a line per step: {report}"
    );
    ensure!(
        report.contains("ReplacedWriters v1beta1") && !report.contains("ActiveWriters"),
        "the writer reported, not breaking: {report}"
    );
    ensure!(
        env.stored_versions(&crd.name).await? == ["v1"],
        "storedVersions trimmed"
    );
    let names: Vec<String> = before.iter().map(|(n, _)| n.clone()).collect();
    if let Some(versions) = stored_as(env, &crd, &names).await? {
        ensure!(
            versions == [format!("{}/v1", crd.group)],
            "every object stored as v1 in etcd: {versions:?}"
        );
    }
    if let Ok(applied) = kubectl_apply(env, &release).await {
        ensure!(
            applied.status.success(),
            "the apply succeeds after the fix: {}",
            text(&applied)
        );
    } else {
        // No kubectl: drop v1beta1 as the apply would.
        patch_crd(
            env,
            &crd.name,
            json!([{"op": "remove", "path": "/spec/versions/0"}]),
        )
        .await?;
    }
    ensure!(
        env.flags(&crd.name).await? == "v1:sS",
        "the release's CRD is applied: {}",
        env.flags(&crd.name).await?
    );
    ensure!(
        specs(env, &crd, "v1").await? == before,
        "every object reads back unchanged"
    );
    let applied = env
        .apply_via(
            &crd,
            "v1",
            "w00003",
            json!({"size": 33, "owner": OPERATOR}),
            OPERATOR,
        )
        .await?;
    ensure!(
        applied["spec"]["size"] == 33,
        "server-side apply by the old manager works: {applied}"
    );
    Ok(())
}

/// The storage version moved from v1 to v2; the older release's CRD has only v1, and the
/// newer operator, which the rollback replaces, wrote through v2 a second before: `check`
/// explains it and names the writer (exit 1), `check --fix --replaced-manager operator-v2`
/// (the writer still writing a second before) moves the storage version back, migrates and
/// trims, exits 0, and the older CRD applies.
pub async fn rollback(env: &Env) -> Outcome {
    let crd = env
        .create_crd("chk-back", &[("v1", true, true), ("v2", true, false)])
        .await?;
    env.create_objects(&crd, "v1", 30).await?;
    switch_storage(env, &crd, 0, 1).await?;
    for i in 30..40 {
        env.apply_via(&crd, "v2", &format!("w{i:05}"), json!({"size": i}), "operator-v2")
            .await?;
    }
    ensure!(
        env.stored_versions(&crd.name).await? == ["v1", "v2"],
        "storedVersions"
    );
    let older = incoming(
        env,
        &crd,
        "older-release",
        json!([open_version("v1", true, true)]),
    )
    .await?;
    let file = older.display().to_string();
    write_a_second_before(env, &crd, "v2", 30..40, "operator-v2").await?;
    let output = run_check(env, None, &["-f", &file]).await?;
    let report = text(&output);
    ensure!(output.status.code() == Some(1), "check exits 1: {report}");
    ensure!(
        report.contains("StoredVersionMissing v2")
            && report.contains("objects are stored as v2, the live storage version, which this CRD lacks"),
        "explains the rollback: {report}"
    );
    ensure!(
        report.contains("ActiveWriters v2") && report.contains("operator-v2 (last write "),
        "names the writer: {report}"
    );
    let before = specs(env, &crd, "v1").await?;
    write_a_second_before(env, &crd, "v2", 30..40, "operator-v2").await?;
    let output = run_check(
        env,
        None,
        &["--fix", "-f", &file, "--replaced-manager", "operator-v2"],
    )
    .await?;
    let report = text(&output);
    ensure!(
        output.status.code() == Some(0),
        "check --fix naming the replaced writer exits 0: {report}"
    );
    ensure!(
        report.contains("moving the storage version back from v2 to v1"),
        "says what it does: {report}"
    );
    ensure!(
        report.contains("ReplacedWriters v2") && !report.contains("ActiveWriters"),
        "the writer reported, not breaking: {report}"
    );
    ensure!(
        env.flags(&crd.name).await? == "v1:sS v2:s",
        "v1 stored again: {}",
        env.flags(&crd.name).await?
    );
    ensure!(
        env.stored_versions(&crd.name).await? == ["v1"],
        "storedVersions trimmed to v1"
    );
    let names: Vec<String> = before.iter().map(|(n, _)| n.clone()).collect();
    if let Some(versions) = stored_as(env, &crd, &names).await? {
        ensure!(
            versions == [format!("{}/v1", crd.group)],
            "every object stored as v1: {versions:?}"
        );
    }
    if let Ok(applied) = kubectl_apply(env, &older).await {
        ensure!(
            applied.status.success(),
            "the older CRD applies: {}",
            text(&applied)
        );
        ensure!(
            env.flags(&crd.name).await? == "v1:sS",
            "{}",
            env.flags(&crd.name).await?
        );
    }
    ensure!(
        specs(env, &crd, "v1").await? == before,
        "every object reads back unchanged"
    );
    Ok(())
}

/// A client the release does not replace writes through v1beta1, a second before each
/// check. A release that stops serving v1beta1: breaking, the writer named with its last
/// write; `--fix` has nothing to do and exits 1. A release that drops v1beta1 while objects
/// are stored as v1beta1: `--fix` migrates, trims and cleans all the same and exits 1, still
/// naming the writer; writing on through v1beta1, the writer's entries name it again; named
/// with `--replaced-manager`, the check passes and says to repair them after the upgrade.
pub async fn writer_unserved(env: &Env) -> Outcome {
    let crd = env
        .create_crd("chk-writer", &[("v1beta1", true, false), ("v1", true, true)])
        .await?;
    env.create_objects(&crd, "v1", 5).await?;
    let release = incoming(
        env,
        &crd,
        "unserve-release",
        json!([
            open_version("v1beta1", false, false),
            open_version("v1", true, true)
        ]),
    )
    .await?;
    let file = release.display().to_string();
    write_a_second_before(env, &crd, "v1beta1", 1..2, "legacy-writer").await?;
    let output = run_check(env, None, &["-f", &file, "-o", "json"]).await?;
    ensure!(
        output.status.code() == Some(1),
        "check exits 1: {}",
        text(&output)
    );
    let report: Value =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("{e}: {}", text(&output)))?;
    let findings = report["clusters"][0]["crds"][0]["findings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let active = findings
        .iter()
        .find(|f| f["kind"] == "ActiveWriters")
        .ok_or_else(|| format!("no ActiveWriters: {report}"))?;
    ensure!(
        active["severity"] == "Breaking" && active["version"] == "v1beta1",
        "{active}"
    );
    ensure!(
        active["managers"][0]["manager"] == "legacy-writer" && active["managers"][0]["lastWrite"].is_string(),
        "the manager and its last write, as separate fields: {active}"
    );
    let before = env.crd(&crd.name).await?.metadata.resource_version;
    write_a_second_before(env, &crd, "v1beta1", 1..2, "legacy-writer").await?;
    let output = run_check(env, None, &["--fix", "-f", &file]).await?;
    let report = text(&output);
    ensure!(
        output.status.code() == Some(1),
        "--fix has nothing to fix, the writer breaks the check: {report}"
    );
    ensure!(
        report.contains("ActiveWriters v1beta1")
            && report.contains("legacy-writer (last write ")
            && !report.contains("NOT FIXED"),
        "names the writer, refuses nothing: {report}"
    );
    ensure!(
        env.crd(&crd.name).await?.metadata.resource_version == before,
        "the CRD is untouched"
    );

    // The release drops v1beta1, with objects stored as v1beta1.
    let dropped = env
        .create_crd("chk-writer-drop", &[("v1beta1", true, true), ("v1", true, false)])
        .await?;
    env.create_objects(&dropped, "v1", 20).await?;
    switch_storage(env, &dropped, 0, 1).await?;
    let release = incoming(
        env,
        &dropped,
        "drop-release",
        json!([open_version("v1", true, true)]),
    )
    .await?;
    let file = release.display().to_string();
    let names: Vec<String> = specs(env, &dropped, "v1")
        .await?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    write_a_second_before(env, &dropped, "v1beta1", 3..4, "legacy-writer").await?;
    let output = run_check(env, None, &["--fix", "-f", &file]).await?;
    let report = text(&output);
    ensure!(
        output.status.code() == Some(1),
        "the unnamed writer fails the check: {report}"
    );
    ensure!(
        report.contains("ActiveWriters v1beta1")
            && report.contains("legacy-writer (last write ")
            && report.contains("rewriting every object into v1")
            && !report.contains("NOT FIXED"),
        "the fix ran, and the writer is still named: {report}"
    );
    ensure!(
        env.stored_versions(&dropped.name).await? == ["v1"],
        "storedVersions trimmed regardless of the writer"
    );
    if let Some(versions) = stored_as(env, &dropped, &names).await? {
        ensure!(
            versions == [format!("{}/v1", dropped.group)],
            "every object stored as v1: {versions:?}"
        );
    }
    // The writer goes on through v1beta1 (still served until the release is applied): the
    // cleaned entry names v1beta1 again.
    write_a_second_before(env, &dropped, "v1beta1", 3..4, "legacy-writer").await?;
    let (_, _, object) = env.get_via(&dropped, "v1", "w00003").await?;
    let entries = object["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(
        entries
            .iter()
            .any(|e| e["manager"] == "legacy-writer"
                && e["apiVersion"] == format!("{}/v1beta1", dropped.group)),
        "a write through v1beta1 names it again: {entries:?}"
    );
    let output = run_check(
        env,
        None,
        &["--fix", "-f", &file, "--replaced-manager", "legacy-writer"],
    )
    .await?;
    let report = text(&output);
    ensure!(
        output.status.code() == Some(0),
        "named as replaced, the writer does not fail the check: {report}"
    );
    ensure!(
        report.contains("ReplacedWriters v1beta1")
            && report.contains("repair-managed-fields")
            && !report.contains("ActiveWriters"),
        "reported, with the repair after the upgrade: {report}"
    );
    Ok(())
}

/// The release tightens the schema under stored objects: each failing object named with its
/// path, the count given; `--fix` refuses.
pub async fn schema_tightens(env: &Env) -> Outcome {
    let crd = env.create_crd("chk-schema", &[("v1", true, true)]).await?;
    env.create_objects(&crd, "v1", 20).await?;
    let tightened = json!([{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
        "type": "object", "properties": {"spec": {"type": "object", "properties": {
            "size": {"type": "integer", "maximum": 5}, "color": {"type": "string"}}}}}}}]);
    let release = incoming(env, &crd, "tight-release", tightened).await?;
    let file = release.display().to_string();
    let output = run_check(
        env,
        None,
        &["-f", &file, "--max-objects", "3", "--page-size", "6"],
    )
    .await?;
    let report = text(&output);
    ensure!(output.status.code() == Some(1), "check exits 1: {report}");
    ensure!(
        report.contains("ObjectsInvalid v1") && report.contains("14 of 20 objects fail this CRD's v1 schema"),
        "counts them: {report}"
    );
    ensure!(
        report.contains("w00006 spec.size: Invalid value: 6: should be less than or equal to 5"),
        "names the first: {report}"
    );
    let output = run_check(env, None, &["--fix", "-f", &file]).await?;
    ensure!(
        output.status.code() == Some(1)
            && text(&output).contains("objects are invalid under the incoming schema"),
        "--fix refuses: {}",
        text(&output)
    );
    Ok(())
}

/// The upgrade hook's ServiceAccount and ClusterRole (`examples/upgrades/`) suffice for
/// `check --fix`: run impersonating it.
pub async fn least_privilege(env: &Env) -> Outcome {
    let crd = env
        .create_crd_ungranted("chk-rbac", &[("v1beta1", true, true), ("v1", true, false)])
        .await?;
    env.create_objects(&crd, "v1beta1", 12).await?;
    switch_storage(env, &crd, 0, 1).await?;
    let account = format!("{}-upgrade-check", env.run_id);
    env.create_service_account(&account).await?;
    let role = crate::examples::upgrade_cluster_role(&format!("{}-upgrade-check", env.run_id), &crd.group)?;
    let role_name = role.metadata.name.clone().unwrap_or_default();
    env.create_cluster_role(role).await?;
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": role_name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": "default"}],
    }))
    .map_err(|e| e.to_string())?;
    env.create_cluster_role_binding(binding).await?;
    let kubeconfig = env.kubeconfig_as(&format!("system:serviceaccount:default:{account}"))?;
    let release = incoming(env, &crd, "rbac-release", json!([open_version("v1", true, true)])).await?;
    let file = release.display().to_string();
    // The hook's account may not update CRDs: check's dry run is refused (recorded in
    // tests/fixtures/apiserver/crd-dry-run-update-forbidden-v1.36.txt), and check words the
    // refusal by the server's version instead.
    let (code, answer) = dry_run_update(env, client_of(&kubeconfig).await?, &crd, &release).await?;
    println!(
        "e2e: check_least_privilege: a dry run of the update as the hook's account answered {code}: {answer}"
    );
    ensure!(
        code == 403,
        "the hook's account may not update CRDs: {code} {answer}"
    );
    let output = run_check(
        env,
        Some(&kubeconfig),
        &["--fix", "-f", &file, "--writers-window", "1s"],
    )
    .await?;
    let report = text(&output);
    ensure!(
        output.status.code() == Some(0),
        "check --fix as the hook's ServiceAccount: {report}"
    );
    ensure!(
        env.stored_versions(&crd.name).await? == ["v1"],
        "trimmed as the hook's account"
    );
    // And nothing beyond: it may not touch a Deployment or read a Secret.
    let user = format!("system:serviceaccount:default:{account}");
    for (verb, resource) in [
        ("get", "secrets"),
        ("patch", "deployments"),
        ("delete", "customresourcedefinitions"),
    ] {
        ensure!(
            !env.can(&user, verb, resource, "other", "default").await?,
            "{user} may {verb} {resource}"
        );
    }
    Ok(())
}
