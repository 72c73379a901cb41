//! The control plane as the benchmarks use it: a client, the kubeconfig for child processes,
//! and the few objects every section creates.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::control_plane::ControlPlane;

pub struct Cluster {
    pub client: Client,
    /// The administrator's kubeconfig, for `crd-lifecycle` child processes.
    pub kubeconfig: PathBuf,
    /// `gitVersion` of the apiserver, e.g. `v1.36.2`.
    pub server_version: String,
}

impl Cluster {
    pub async fn connect(plane: &ControlPlane) -> Result<Cluster, String> {
        let client = plane.client().await?;
        let version = client
            .apiserver_version()
            .await
            .map_err(|e| format!("cannot read the apiserver's version: {e}"))?;
        Ok(Cluster {
            client,
            kubeconfig: plane.kubeconfig.clone(),
            server_version: version.git_version,
        })
    }

    /// A client of its own, with no connection open yet.
    pub async fn new_client(&self) -> Result<Client, String> {
        crate::control_plane::client_of(&self.kubeconfig).await
    }

    /// Installs the VersionPolicy CRD (once).
    pub async fn install_policy_crd(&self) -> Result<(), String> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        if api
            .get_opt("versionpolicies.crdlifecycle.io")
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Ok(());
        }
        let text = include_str!("../../crds/versionpolicy.yaml");
        let crd: CustomResourceDefinition = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        api.create(&PostParams::default(), &crd)
            .await
            .map_err(|e| format!("cannot install the VersionPolicy CRD: {e}"))?;
        self.wait_established(&["versionpolicies.crdlifecycle.io".to_owned()])
            .await
    }

    /// POSTs `body` (JSON) to the collection at `path`.
    pub async fn create(&self, path: &str, body: &Value) -> Result<(), kube::Error> {
        let request = http::Request::post(path)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap_or_default())
            .map_err(kube::Error::HttpError)?;
        self.client.request::<Value>(request).await.map(|_| ())
    }

    /// Creates CRDs, `parallel` at a time, and waits until every one is established.
    pub async fn create_crds(&self, crds: Vec<Value>, parallel: usize) -> Result<(), String> {
        let names: Vec<String> = crds
            .iter()
            .map(|c| c["metadata"]["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        let results: Vec<Result<(), String>> = futures::stream::iter(crds)
            .map(|crd| async move {
                let name = crd["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", &crd)
                    .await
                    .map_err(|e| format!("cannot create CRD {name}: {e}"))
            })
            .buffer_unordered(parallel)
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<()>, String>>()?;
        self.wait_established(&names).await
    }

    /// Waits (at most 10 minutes) until every named CRD is Established.
    pub async fn wait_established(&self, names: &[String]) -> Result<(), String> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let started = Instant::now();
        let mut waiting: Vec<String> = names.to_vec();
        while !waiting.is_empty() {
            if started.elapsed() > Duration::from_secs(600) {
                return Err(format!(
                    "{} CRDs not established within 10 minutes (first: {})",
                    waiting.len(),
                    waiting[0]
                ));
            }
            let list = api
                .list(&Default::default())
                .await
                .map_err(|e| format!("cannot list CRDs: {e}"))?;
            let established: std::collections::HashSet<String> = list
                .items
                .iter()
                .filter(|crd| {
                    crd.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
                })
                .filter_map(|crd| crd.metadata.name.clone())
                .collect();
            waiting.retain(|name| !established.contains(name));
            if !waiting.is_empty() {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        Ok(())
    }

    /// Makes `version` the CRD's storage version (the other versions stay served).
    pub async fn set_storage(&self, crd: &str, version: &str) -> Result<(), String> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let current = api.get(crd).await.map_err(|e| e.to_string())?;
        let ops: Vec<Value> = current
            .spec
            .versions
            .iter()
            .enumerate()
            .map(|(i, v)| json!({"op": "replace", "path": format!("/spec/versions/{i}/storage"), "value": v.name == version}))
            .collect();
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(ops)).map_err(|e| e.to_string())?;
        api.patch(crd, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .map_err(|e| format!("cannot switch {crd}'s storage to {version}: {e}"))?;
        Ok(())
    }

    /// `status.storedVersions` of a CRD.
    pub async fn stored_versions(&self, crd: &str) -> Result<Vec<String>, String> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let current = api.get(crd).await.map_err(|e| e.to_string())?;
        Ok(current.status.and_then(|s| s.stored_versions).unwrap_or_default())
    }

    /// Creates namespaces `ns0`.. `ns{count-1}` (those that exist are left alone).
    pub async fn create_namespaces(&self, count: usize) -> Result<(), String> {
        for i in 0..count {
            let namespace =
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("ns{i}")}});
            match self.create("/api/v1/namespaces", &namespace).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(error) => return Err(format!("cannot create namespace ns{i}: {error}")),
            }
        }
        Ok(())
    }

    /// Creates `count` objects of a namespaced CRD through `version`, spread over
    /// `namespaces` namespaces, 32 at a time.
    pub async fn create_objects(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        count: usize,
        namespaces: usize,
    ) -> Result<(), String> {
        let results: Vec<Result<(), String>> = futures::stream::iter(0..count)
            .map(|i| {
                async move {
                    let namespace = format!("ns{}", i % namespaces.max(1));
                    let body = json!({"apiVersion": format!("{group}/{version}"), "kind": kind,
                                      "metadata": {"name": format!("w{i:06}"), "namespace": namespace},
                                      "spec": {"size": i, "color": "blue", "labels": {"team": "bench", "tier": "backend"}}});
                    self.create(&format!("/apis/{group}/{version}/namespaces/{namespace}/{plural}"), &body)
                        .await
                        .map_err(|e| format!("cannot create object {i}: {e}"))
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        results.into_iter().collect::<Result<Vec<()>, String>>()?;
        Ok(())
    }
}

/// A namespaced CRD whose versions (name, served, storage) accept any spec.
pub fn crd(group: &str, plural: &str, kind: &str, versions: &[(&str, bool, bool)]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|(name, served, storage)| {
            json!({"name": name, "served": served, "storage": storage,
                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                       "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}})
        })
        .collect();
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": format!("{plural}.{group}")},
           "spec": {"group": group, "scope": "Namespaced",
                    "names": {"plural": plural, "singular": plural.trim_end_matches('s'), "kind": kind, "listKind": format!("{kind}List")},
                    "versions": versions}})
}

/// `nproc`, memory and CPU model of this machine.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory_gib = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0 / 1024.0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_default();
    format!("nproc {cores}, {memory_gib:.0} GiB memory, {model}")
}

/// The `q` quantile of sorted durations.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}
