//! The cluster the suite runs against, the controller it starts, and helpers that create
//! (and remember, to clean up) everything a scenario needs.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crd_lifecycle::migrate::builtin::Migrations;
use futures::StreamExt;

use crate::control_plane::DiesWithParent as _;
use http::HeaderMap;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, PostParams};
use kube::client::Body;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

pub type Outcome = Result<(), String>;

/// Fails the scenario with a message.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err(format!($($arg)+));
        }
    };
}

pub struct Env {
    pub client: Client,
    /// Unique per run: every name the suite creates contains it.
    pub run_id: String,
    pub in_cluster: bool,
    /// `major.minor` of the apiserver, e.g. (1, 21).
    pub server_version: (u32, u32),
    controller: Mutex<Option<Child>>,
    created_policy_crd: Mutex<bool>,
    cleanup: Mutex<Vec<Cleanup>>,
    /// The kubeconfig every client and child process uses (the suite's own control plane's,
    /// or `KUBECONFIG`'s).
    kubeconfig: Option<std::path::PathBuf>,
    /// The control plane the suite started, if it did (only such a one may a scenario
    /// restart or compact).
    control_plane: Option<crate::control_plane::ControlPlane>,
}

pub use crate::control_plane::lock;

enum Cleanup {
    Crd(String),
    Policy(String),
    ClusterRole(String),
    ClusterRoleBinding(String),
    ServiceAccount(String),
    /// Any object, by its path (DELETE).
    Path(String),
}

impl Env {
    /// Connects to the suite's own control plane, or else to the cluster of `KUBECONFIG` (or
    /// in-cluster); `Err` says why not.
    pub async fn connect(control_plane: Option<crate::control_plane::ControlPlane>) -> Result<Env, String> {
        let kubeconfig = control_plane.as_ref().map(|plane| plane.kubeconfig.clone());
        let client = match &control_plane {
            Some(plane) => plane.client().await?,
            None => tokio::time::timeout(Duration::from_secs(10), Client::try_default())
                .await
                .map_err(|_| "timed out loading the cluster configuration".to_owned())?
                .map_err(|e| e.to_string())?,
        };
        let version = tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
            .await
            .map_err(|_| "the apiserver did not answer within 10 s".to_owned())?
            .map_err(|e| e.to_string())?;
        let number = |s: &str| s.trim_end_matches('+').parse::<u32>().unwrap_or(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Ok(Env {
            client,
            run_id: format!("e2e{:x}{:x}", std::process::id() % 0xfff, nanos % 0xfffff),
            in_cluster: std::env::var("E2E_IN_CLUSTER").is_ok_and(|v| v == "1"),
            server_version: (number(&version.major), number(&version.minor)),
            controller: Mutex::new(None),
            created_policy_crd: Mutex::new(false),
            cleanup: Mutex::new(Vec::new()),
            kubeconfig,
            control_plane,
        })
    }

    /// The control plane the suite started, if it did: only such a one may a scenario restart
    /// or compact.
    pub fn control_plane(&self) -> Option<&crate::control_plane::ControlPlane> {
        self.control_plane.as_ref()
    }

    /// The kubeconfig path child processes (the controller, kubectl) get, where it is not
    /// the default one.
    pub fn kubeconfig(&self) -> Option<&std::path::Path> {
        self.kubeconfig.as_deref()
    }

    /// Gives a child process the suite's kubeconfig.
    pub fn with_kubeconfig<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        if let Some(path) = &self.kubeconfig {
            command.env("KUBECONFIG", path);
        }
        command
    }

    pub fn clone_client(&self) -> Client {
        self.client.clone()
    }

    /// Whether the apiserver evaluates CEL validation rules (1.25+).
    pub fn has_cel(&self) -> bool {
        self.server_version >= (1, 25)
    }

    /// Installs the VersionPolicy CRD if the cluster lacks it (removed again at the end).
    pub async fn install_policy_crd(&self) -> Outcome {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        if api
            .get_opt("versionpolicies.crdlifecycle.io")
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Ok(());
        }
        if self.in_cluster {
            return Err(
                "E2E_IN_CLUSTER=1 but the VersionPolicy CRD is not installed (apply crds/ and deploy/)"
                    .into(),
            );
        }
        let text = include_str!("../../crds/versionpolicy.yaml");
        let crd: CustomResourceDefinition = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        api.create(&PostParams::default(), &crd)
            .await
            .map_err(|e| e.to_string())?;
        *self.created_policy_crd.lock().expect("lock") = true;
        self.wait_established("versionpolicies.crdlifecycle.io").await
    }

    /// Starts `crd-lifecycle run` as a child process (local-controller mode).
    pub fn start_controller(&self) -> Outcome {
        if self.in_cluster {
            return Ok(());
        }
        self.spawn_controller(None)
    }

    /// Starts the local controller with the credentials of `kubeconfig` (e.g. one that
    /// impersonates a ServiceAccount), without the conversion webhook (whose certificate
    /// Secret such an account may not read).
    pub fn start_controller_with(&self, kubeconfig: &std::path::Path) -> Outcome {
        self.spawn_controller(Some(kubeconfig))
    }

    fn spawn_controller(&self, kubeconfig: Option<&std::path::Path>) -> Outcome {
        let free_port = || {
            TcpListener::bind("0.0.0.0:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| e.to_string())
        };
        let port = free_port()?;
        let log_path = std::env::temp_dir().join(format!("crd-lifecycle-{}.log", self.run_id));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| e.to_string())?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"));
        command
            .dies_with_parent()
            .args([
                "run",
                "--leader-election=false",
                "--resync",
                "30s",
                "--traffic-sample-interval",
                "1s",
            ])
            .arg(format!("--metrics-addr=127.0.0.1:{port}"));
        match kubeconfig {
            Some(path) => {
                command.env("KUBECONFIG", path);
            }
            None => {
                self.with_kubeconfig(&mut command);
                // The conversion webhook: the apiserver must reach this machine at
                // E2E_WEBHOOK_HOST (127.0.0.1 for an apiserver on the same machine).
                let webhook_port = free_port()?;
                let webhook_host =
                    std::env::var("E2E_WEBHOOK_HOST").unwrap_or_else(|_| "127.0.0.1".to_owned());
                command
                    .arg(format!("--webhook-port={webhook_port}"))
                    .arg(format!("--webhook-url=https://{webhook_host}:{webhook_port}"))
                    .arg(format!("--webhook-secret={}", self.webhook_secret()));
            }
        }
        let child = command
            .env("POD_NAMESPACE", "default")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log.try_clone().map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("cannot start the controller: {e}"))?;
        println!(
            "e2e: controller started (pid {}), log: {}",
            child.id(),
            log_path.display()
        );
        *self.controller.lock().expect("lock") = Some(child);
        Ok(())
    }

    /// The Secret the local controller keeps its webhook certificates in (in `default`).
    pub fn webhook_secret(&self) -> String {
        format!("{}-webhook-tls", self.run_id)
    }

    /// Kills the local controller at once (no graceful shutdown), as a crash would.
    pub fn kill_controller(&self) {
        if let Some(mut child) = self.controller.lock().expect("lock").take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Removes everything the suite created, and stops the controller.
    pub async fn teardown(&self) {
        self.cleanup_scenario().await;
        self.kill_controller();
        if !self.in_cluster {
            let secrets: Api<k8s_openapi::api::core::v1::Secret> =
                Api::namespaced(self.client.clone(), "default");
            let _ = secrets
                .delete(&self.webhook_secret(), &DeleteParams::default())
                .await;
        }
        if *self.created_policy_crd.lock().expect("lock") {
            let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
            let _ = api
                .delete("versionpolicies.crdlifecycle.io", &DeleteParams::default())
                .await;
        }
        if let Some(plane) = &self.control_plane {
            plane.stop();
        }
    }

    /// `kubectl delete vp NAME` (the controller's finalizer then releases the CRD).
    pub async fn delete_policy(&self, name: &str) -> Outcome {
        self.policy_api()
            .delete(name, &DeleteParams::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Whether the policy still exists (deleted ones may wait for their finalizer).
    pub async fn policy_exists(&self, name: &str) -> Result<bool, String> {
        self.policy_api()
            .get_opt(name)
            .await
            .map(|p| p.is_some())
            .map_err(|e| e.to_string())
    }

    /// Deletes a policy; if the controller does not release it within 10 s (it may be
    /// stopped already), clears its finalizers so that nothing is left behind.
    async fn delete_policy_for_cleanup(&self, name: &str) -> Result<(), kube::Error> {
        let api: Api<kube::core::DynamicObject> = self.policy_api();
        api.delete(name, &DeleteParams::default()).await?;
        for _ in 0..20 {
            if api.get_opt(name).await?.is_none() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        println!("e2e: {name} was not released in 10 s; clearing its finalizers");
        let patch = serde_json::json!({"metadata": {"finalizers": null}});
        api.patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
    }

    /// Deletes what the last scenario created (on success and on failure).
    pub async fn cleanup_scenario(&self) {
        // StorageVersionMigrations of this run's CRDs go first: kube-controller-manager
        // v1.36.2 panics when a migration's resource disappears under it.
        self.delete_storage_version_migrations().await;
        let items: Vec<Cleanup> = self.cleanup.lock().expect("lock").drain(..).collect();
        for item in items.into_iter().rev() {
            let result = match &item {
                Cleanup::Policy(name) => self.delete_policy_for_cleanup(name).await,
                Cleanup::Crd(name) => {
                    let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
                    api.delete(name, &DeleteParams::default()).await.map(|_| ())
                }
                Cleanup::ClusterRole(name) => {
                    let api: Api<ClusterRole> = Api::all(self.client.clone());
                    api.delete(name, &DeleteParams::default()).await.map(|_| ())
                }
                Cleanup::ClusterRoleBinding(name) => {
                    let api: Api<ClusterRoleBinding> = Api::all(self.client.clone());
                    api.delete(name, &DeleteParams::default()).await.map(|_| ())
                }
                Cleanup::ServiceAccount(name) => {
                    let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), "default");
                    api.delete(name, &DeleteParams::default()).await.map(|_| ())
                }
                Cleanup::Path(path) => match http::Request::delete(path.as_str()).body(Vec::new()) {
                    Ok(request) => self.client.request_text(request).await.map(|_| ()),
                    Err(error) => Err(kube::Error::HttpError(error)),
                },
            };
            if let Err(kube::Error::Api(status)) = &result
                && status.code != 404
            {
                println!("e2e: cleanup failed: {}", status.message);
            }
        }
    }

    /// Deletes the StorageVersionMigrations of this run's CRDs, where the API is served.
    async fn delete_storage_version_migrations(&self) {
        let Ok(Some(api)) = Migrations::discover(&self.client).await else {
            return;
        };
        let path = format!(
            "/apis/{}/{}/storageversionmigrations",
            crd_lifecycle::migrate::builtin::GROUP,
            api.version
        );
        let Ok(request) = http::Request::get(&path).body(Vec::new()) else {
            return;
        };
        let Ok(list) = self.client.request::<Value>(request).await else {
            return;
        };
        for item in list["items"].as_array().into_iter().flatten() {
            let group = item["spec"]["resource"]["group"].as_str().unwrap_or_default();
            let name = item["metadata"]["name"].as_str().unwrap_or_default();
            if group.starts_with(&self.run_id)
                && let Ok(request) = http::Request::delete(format!("{path}/{name}")).body(Vec::new())
            {
                let _ = self.client.request_text(request).await;
            }
        }
    }

    pub fn policy_api(&self) -> Api<kube::core::DynamicObject> {
        let resource = kube::discovery::ApiResource {
            group: "crdlifecycle.io".into(),
            version: "v1alpha1".into(),
            api_version: "crdlifecycle.io/v1alpha1".into(),
            kind: "VersionPolicy".into(),
            plural: "versionpolicies".into(),
        };
        Api::all_with(self.client.clone(), &resource)
    }

    /// Creates a cluster-scoped CRD `widgets.<run>-<suffix>.e2e.crdlifecycle.test` with
    /// the given versions `(name, served, storage)`; objects have `spec` with any fields.
    pub async fn create_crd(&self, suffix: &str, versions: &[(&str, bool, bool)]) -> Result<TestCrd, String> {
        let crd = self.create_crd_ungranted(suffix, versions).await?;
        // The operator deployed from deploy/ may touch only the objects of CRDs a labelled
        // ClusterRole grants (least privilege): grant this one, as its owning team would.
        if self.in_cluster {
            self.grant(&crd.name).await?;
        }
        Ok(crd)
    }

    /// Creates the labelled ClusterRole `crd-lifecycle rbac CRD` prints, so that the
    /// operator's migrator role aggregates it.
    pub async fn grant(&self, crd: &str) -> Outcome {
        let role: ClusterRole =
            serde_json::from_value(crd_lifecycle::migrate::permissions::cluster_role(crd, false))
                .map_err(|e| e.to_string())?;
        self.create_cluster_role(role).await
    }

    /// Creates a ClusterRole (deleted after the scenario).
    pub async fn create_cluster_role(&self, role: ClusterRole) -> Outcome {
        let name = role.name_any();
        Api::<ClusterRole>::all(self.client.clone())
            .create(&PostParams::default(), &role)
            .await
            .map_err(|e| format!("cannot create ClusterRole {name}: {e}"))?;
        self.cleanup
            .lock()
            .expect("lock")
            .push(Cleanup::ClusterRole(name));
        Ok(())
    }

    /// Creates a ClusterRoleBinding (deleted after the scenario).
    pub async fn create_cluster_role_binding(&self, binding: ClusterRoleBinding) -> Outcome {
        let name = binding.name_any();
        Api::<ClusterRoleBinding>::all(self.client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .map_err(|e| format!("cannot create ClusterRoleBinding {name}: {e}"))?;
        self.cleanup
            .lock()
            .expect("lock")
            .push(Cleanup::ClusterRoleBinding(name));
        Ok(())
    }

    /// Creates a ServiceAccount in `default` (deleted after the scenario).
    pub async fn create_service_account(&self, name: &str) -> Outcome {
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).map_err(|e| e.to_string())?;
        Api::<ServiceAccount>::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &account)
            .await
            .map_err(|e| format!("cannot create ServiceAccount {name}: {e}"))?;
        self.cleanup
            .lock()
            .expect("lock")
            .push(Cleanup::ServiceAccount(name.to_owned()));
        Ok(())
    }

    /// Whether `user` may `verb` `resource` named `name` in `namespace` (what `kubectl auth
    /// can-i VERB RESOURCE/NAME -n NAMESPACE --as USER` asks), by a SubjectAccessReview.
    pub async fn can(
        &self,
        user: &str,
        verb: &str,
        resource: &str,
        name: &str,
        namespace: &str,
    ) -> Result<bool, String> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_owned()),
                groups: Some(vec![
                    "system:serviceaccounts".into(),
                    "system:authenticated".into(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.to_owned()),
                    resource: Some(resource.to_owned()),
                    name: Some(name.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answered = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| e.to_string())?;
        Ok(answered.status.is_some_and(|s| s.allowed))
    }

    /// A copy of the suite's kubeconfig that impersonates `user` (kubectl's `--as`).
    pub fn kubeconfig_as(&self, user: &str) -> Result<std::path::PathBuf, String> {
        let mut config = match &self.kubeconfig {
            Some(path) => kube::config::Kubeconfig::read_from(path),
            None => kube::config::Kubeconfig::read(),
        }
        .map_err(|e| e.to_string())?;
        let context = config.current_context.clone().unwrap_or_default();
        let user_name = config
            .contexts
            .iter()
            .find(|c| c.name == context)
            .and_then(|c| c.context.as_ref())
            .and_then(|c| c.user.clone())
            .ok_or("the kubeconfig's current context names no user")?;
        for auth in &mut config.auth_infos {
            if auth.name == user_name
                && let Some(info) = auth.auth_info.as_mut()
            {
                info.impersonate = Some(user.to_owned());
                info.impersonate_groups = Some(vec!["system:serviceaccounts".into()]);
            }
        }
        let path = std::env::temp_dir().join(format!("{}-kubeconfig-as.yaml", self.run_id));
        let text = serde_json::to_string(&config).map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        Ok(path)
    }

    /// Creates a cluster-scoped CRD without granting the operator anything on its objects.
    pub async fn create_crd_ungranted(
        &self,
        suffix: &str,
        versions: &[(&str, bool, bool)],
    ) -> Result<TestCrd, String> {
        let group = format!("{}-{suffix}.e2e.crdlifecycle.test", self.run_id);
        let name = format!("widgets.{group}");
        let versions: Vec<Value> = versions
            .iter()
            .map(|(v, served, storage)| {
                json!({"name": v, "served": served, "storage": storage,
                       "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                           "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}})
            })
            .collect();
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name, "labels": {"e2e.crdlifecycle.io/run": self.run_id}},
            "spec": {"group": group, "scope": "Cluster", "versions": versions,
                     "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"}},
        }))
        .map_err(|e| e.to_string())?;
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        api.create(&PostParams::default(), &crd)
            .await
            .map_err(|e| e.to_string())?;
        self.cleanup
            .lock()
            .expect("lock")
            .push(Cleanup::Crd(name.clone()));
        self.wait_established(&name).await?;
        Ok(TestCrd { name, group })
    }

    pub async fn wait_established(&self, name: &str) -> Outcome {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let established = kube::runtime::conditions::is_crd_established();
        let waited = kube::runtime::wait::await_condition(api, name, established);
        tokio::time::timeout(Duration::from_secs(30), waited)
            .await
            .map_err(|_| format!("{name} not Established within 30 s"))?
            .map_err(|e| e.to_string())?;
        // The new resource's endpoints appear in discovery a moment after Established.
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(())
    }

    pub async fn crd(&self, name: &str) -> Result<CustomResourceDefinition, String> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        api.get(name).await.map_err(|e| e.to_string())
    }

    /// The CRD's versions as `name:flags` (s served, S storage, d deprecated).
    pub async fn flags(&self, name: &str) -> Result<String, String> {
        Ok(crate::flags::of_crd(&self.crd(name).await?))
    }

    pub async fn stored_versions(&self, name: &str) -> Result<Vec<String>, String> {
        Ok(self
            .crd(name)
            .await?
            .status
            .and_then(|s| s.stored_versions)
            .unwrap_or_default())
    }

    /// Creates any object by POSTing it to `collection` (e.g.
    /// `/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies`); deleted with
    /// the scenario.
    pub async fn create_raw(&self, collection: &str, object: Value) -> Outcome {
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let request = http::Request::post(collection)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&object).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        self.client
            .request_text(request)
            .await
            .map_err(|e| format!("POST {collection}: {e}"))?;
        self.cleanup
            .lock()
            .expect("lock")
            .push(Cleanup::Path(format!("{collection}/{name}")));
        Ok(())
    }

    /// Creates a VersionPolicy (any JSON, so that invalid ones reach the apiserver).
    pub async fn create_policy(&self, policy: Value) -> Result<(), String> {
        let object: kube::core::DynamicObject = serde_json::from_value(policy).map_err(|e| e.to_string())?;
        let name = object.name_any();
        self.policy_api()
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| match e {
                kube::Error::Api(status) => format!("{} {}: {}", status.code, status.reason, status.message),
                other => other.to_string(),
            })?;
        self.cleanup.lock().expect("lock").push(Cleanup::Policy(name));
        Ok(())
    }

    /// Merge-patches a policy (a list such as `spec.versions` is replaced whole).
    pub async fn patch_policy(&self, name: &str, patch: Value) -> Result<(), String> {
        self.policy_api()
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    pub async fn policy(&self, name: &str) -> Result<Value, String> {
        let object = self.policy_api().get(name).await.map_err(|e| e.to_string())?;
        serde_json::to_value(object).map_err(|e| e.to_string())
    }

    /// `(status, reason, message)` of a policy condition.
    pub async fn condition(&self, policy: &str, type_: &str) -> Result<(String, String, String), String> {
        let policy = self.policy(policy).await?;
        let condition = policy["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
            .cloned()
            .unwrap_or(Value::Null);
        let text = |k: &str| condition[k].as_str().unwrap_or_default().to_owned();
        Ok((text("status"), text("reason"), text("message")))
    }

    /// Creates `count` objects through `version`, 16 at a time; returns their names and
    /// resourceVersions.
    pub async fn create_objects(
        &self,
        crd: &TestCrd,
        version: &str,
        count: usize,
    ) -> Result<Vec<(String, String)>, String> {
        let results: Vec<Result<(String, String), String>> = futures::stream::iter(0..count)
            .map(|i| async move {
                let name = format!("w{i:05}");
                let body = json!({"apiVersion": format!("{}/{version}", crd.group), "kind": "Widget",
                                  "metadata": {"name": name}, "spec": {"size": i, "color": "blue"}});
                let request = http::Request::post(format!("/apis/{}/{version}/widgets", crd.group))
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(&body).unwrap_or_default())
                    .map_err(|e| e.to_string())?;
                let created: Value = self.client.request(request).await.map_err(|e| e.to_string())?;
                Ok((
                    name,
                    created["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                ))
            })
            .buffer_unordered(16)
            .collect()
            .await;
        results.into_iter().collect()
    }

    /// Server-side applies `spec` to the object `name` through `version` as `manager`.
    pub async fn apply_via(
        &self,
        crd: &TestCrd,
        version: &str,
        name: &str,
        spec: Value,
        manager: &str,
    ) -> Result<Value, String> {
        let resource = kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(&crd.group, version, "Widget"),
            "widgets",
        );
        let api: Api<kube::core::DynamicObject> = Api::all_with(self.client.clone(), &resource);
        let object = json!({"apiVersion": format!("{}/{version}", crd.group), "kind": "Widget",
                            "metadata": {"name": name}, "spec": spec});
        let applied = api
            .patch(
                name,
                &kube::api::PatchParams::apply(manager).force(),
                &kube::api::Patch::Apply(&object),
            )
            .await
            .map_err(|e| format!("server-side apply of {name} through {version}: {e}"))?;
        serde_json::to_value(applied).map_err(|e| e.to_string())
    }

    /// GET an object through a version: status code, headers, body.
    pub async fn get_via(
        &self,
        crd: &TestCrd,
        version: &str,
        name: &str,
    ) -> Result<(u16, HeaderMap, Value), String> {
        let request = http::Request::get(format!("/apis/{}/{version}/widgets/{name}", crd.group))
            .body(Body::empty())
            .map_err(|e| e.to_string())?;
        let response = self.client.send(request).await.map_err(|e| e.to_string())?;
        let code = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response
            .into_body()
            .collect_bytes()
            .await
            .map_err(|e| e.to_string())?;
        Ok((
            code,
            headers,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    /// Every object through a version (all pages).
    pub async fn list_via(&self, crd: &TestCrd, version: &str) -> Result<Vec<Value>, String> {
        let mut items = Vec::new();
        let mut token = String::new();
        loop {
            let mut uri = format!("/apis/{}/{version}/widgets?limit=500", crd.group);
            if !token.is_empty() {
                uri.push_str(&format!("&continue={token}"));
            }
            let request = http::Request::get(uri)
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            let list: Value = self.client.request(request).await.map_err(|e| e.to_string())?;
            items.extend(list["items"].as_array().cloned().unwrap_or_default());
            token = list["metadata"]["continue"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if token.is_empty() {
                return Ok(items);
            }
        }
    }

    /// Reasons of the events about a policy (cluster-scoped: in `default`).
    pub async fn event_reasons(&self, policy: &str) -> Result<Vec<String>, String> {
        let request = http::Request::get("/apis/events.k8s.io/v1/namespaces/default/events?limit=500")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let list: Value = self.client.request(request).await.map_err(|e| e.to_string())?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["regarding"]["name"] == policy && e["regarding"]["kind"] == "VersionPolicy")
            .filter_map(|e| e["reason"].as_str().map(str::to_owned))
            .collect())
    }

    /// `kubectl wait --for=condition=Ready vp/NAME` returns (within 60 s), where kubectl is
    /// installed; without it, says so and passes.
    pub async fn kubectl_wait_ready(&self, name: &str) -> Result<(), String> {
        let mut kubectl = tokio::process::Command::new("kubectl");
        if let Some(path) = &self.kubeconfig {
            kubectl.env("KUBECONFIG", path);
        }
        let output = kubectl
            .args([
                "wait",
                "--for=condition=Ready",
                &format!("versionpolicy/{name}"),
                "--timeout=60s",
            ])
            .output()
            .await;
        match output {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("e2e: no kubectl on the PATH: `kubectl wait` not checked");
                Ok(())
            }
            Err(error) => Err(format!("kubectl wait: {error}")),
            Ok(output) if output.status.success() => Ok(()),
            Ok(output) => Err(format!(
                "kubectl wait --for=condition=Ready vp/{name} failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )),
        }
    }

    /// The `kubectl get vp NAME` columns, from the apiserver's Table rendering.
    pub async fn policy_columns(&self, name: &str) -> Result<Vec<(String, String)>, String> {
        let request = http::Request::get(format!("/apis/crdlifecycle.io/v1alpha1/versionpolicies/{name}"))
            .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let table: Value = self.client.request(request).await.map_err(|e| e.to_string())?;
        let names: Vec<String> = table["columnDefinitions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        let cells = table["rows"][0]["cells"].as_array().cloned().unwrap_or_default();
        Ok(names
            .into_iter()
            .zip(cells)
            .map(|(n, c)| (n, c.as_str().map_or_else(|| c.to_string(), str::to_owned)))
            .collect())
    }
}

/// A CRD a scenario created.
pub struct TestCrd {
    pub name: String,
    pub group: String,
}

/// Polls `check` every 200 ms until it returns `Ok(true)`, failing after `limit`.
/// The scenarios that skipped in this run, and why.
static SKIPPED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Records that `scenario` cannot run here (`reason`): the run reports it as skipped, not
/// passed.
pub fn skip(scenario: &str, reason: &str) -> Outcome {
    lock(&SKIPPED).push((scenario.to_owned(), reason.to_owned()));
    Ok(())
}

/// Why `scenario` skipped, if it did.
pub fn skipped(scenario: &str) -> Option<String> {
    lock(&SKIPPED)
        .iter()
        .find(|(name, _)| name == scenario)
        .map(|(_, reason)| reason.clone())
}

/// The built-in StorageVersionMigration API where the server serves storagemigration.k8s.io;
/// elsewhere `None`, `scenario` recorded as skipped.
pub async fn builtin_migrations(env: &Env, scenario: &str) -> Result<Option<Migrations>, String> {
    let api = Migrations::discover(&env.client)
        .await
        .map_err(|e| format!("cannot discover storagemigration.k8s.io: {e}"))?;
    if api.is_none() {
        skip(scenario, "the server does not serve storagemigration.k8s.io")?;
    }
    Ok(api)
}

pub async fn wait_for<F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<Instant, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, String>>,
{
    let started = Instant::now();
    let mut last_error = String::new();
    while started.elapsed() < limit {
        match check().await {
            Ok(true) => return Ok(Instant::now()),
            Ok(false) => {}
            Err(error) => last_error = error,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "timed out after {limit:?} waiting until {what} {last_error}"
    ))
}

/// An RFC 3339 instant `seconds` from now.
pub fn in_seconds(seconds: i64) -> (String, Instant) {
    let (now, monotonic) = (jiff::Timestamp::now(), Instant::now());
    let exact = now + jiff::SignedDuration::from_secs(seconds);
    // Instants in a policy are whole seconds: the monotonic instant is the rounded one's.
    let at = exact.round(jiff::Unit::Second).unwrap_or(exact);
    let offset = at.duration_since(now).as_secs_f64().max(0.0);
    (at.to_string(), monotonic + Duration::from_secs_f64(offset))
}
