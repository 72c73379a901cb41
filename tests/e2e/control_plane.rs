//! A control plane of its own for the suite, envtest-style: when `KUBEBUILDER_ASSETS` names a
//! directory holding `etcd` and `kube-apiserver` (and, optionally, `kube-controller-manager`),
//! the suite starts them on loopback (free ports, fresh certificates, a token user,
//! service-account keys, RBAC on, the controller manager where present so that role
//! aggregation, garbage collection and the built-in storage version migrator work), runs every
//! scenario against them and stops them.
//!
//! Only a control plane the suite started may be restarted or compacted by a scenario
//! (`Env::control_plane`).

use std::net::TcpListener;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The token of the suite's administrator (`system:masters`).
const ADMIN_TOKEN_USER: &str = "e2e-admin";

/// A running etcd + kube-apiserver (+ kube-controller-manager) on loopback.
pub struct ControlPlane {
    dir: PathBuf,
    assets: PathBuf,
    /// `major.minor` of the kube-apiserver binary.
    pub version: (u32, u32),
    etcd: Mutex<Option<Child>>,
    etcd_port: u16,
    apiserver: Mutex<Option<Child>>,
    apiserver_args: Vec<String>,
    controller_manager: Mutex<Option<Child>>,
    /// A kubeconfig for the administrator (token auth).
    pub kubeconfig: PathBuf,
    stopped: std::sync::atomic::AtomicBool,
}

/// Where the binaries are, if the suite is to start its own control plane.
pub fn assets() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("KUBEBUILDER_ASSETS")?);
    (!dir.as_os_str().is_empty()).then_some(dir)
}

/// A free port on loopback.
pub fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// `(major, minor)` from `kube-apiserver --version` ("Kubernetes v1.36.2").
fn binary_version(binary: &Path) -> Result<(u32, u32), String> {
    let output = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text
        .split_whitespace()
        .find_map(|word| word.strip_prefix('v'))
        .ok_or_else(|| format!("{} --version printed {text:?}", binary.display()))?;
    let mut parts = version.split(['.', '-', '+']);
    let number = |part: Option<&str>| part.and_then(|p| p.parse::<u32>().ok());
    match (number(parts.next()), number(parts.next())) {
        (Some(major), Some(minor)) => Ok((major, minor)),
        _ => Err(format!("cannot read the version in {text:?}")),
    }
}

/// `(major, minor)` from `etcd --version` ("etcd Version: 3.5.21"); (0, 0) when unknown.
fn etcd_version(binary: &Path) -> (u32, u32) {
    let Ok(output) = Command::new(binary).arg("--version").output() else {
        return (0, 0);
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let Some(version) = text.lines().find_map(|l| l.strip_prefix("etcd Version: ")) else {
        return (0, 0);
    };
    let mut parts = version.split(['.', ' ']);
    let number = |part: Option<&str>| part.and_then(|p| p.parse::<u32>().ok()).unwrap_or(0);
    (number(parts.next()), number(parts.next()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn log_file(path: &Path) -> Result<Stdio, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(Stdio::from)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))
}

/// Stops a process: SIGTERM, then SIGKILL after `grace`.
fn stop(child: &mut Child, grace: Duration) {
    sigterm(child);
    let started = Instant::now();
    while started.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and (where its binary is present) kube-controller-manager
    /// from `assets`, and waits until the apiserver is ready.
    pub async fn start(assets: &Path) -> Result<ControlPlane, String> {
        let binary = |name: &str| assets.join(name);
        for required in ["etcd", "kube-apiserver"] {
            if !binary(required).is_file() {
                return Err(format!(
                    "KUBEBUILDER_ASSETS={} has no {required}",
                    assets.display()
                ));
            }
        }
        let version = binary_version(&binary("kube-apiserver"))?;
        if version.0 == 0 {
            return Err(format!(
                "{} reports no version (built without version ldflags?): the suite picks flags by version",
                binary("kube-apiserver").display()
            ));
        }
        let has_controller_manager = binary("kube-controller-manager").is_file();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("crd-lifecycle-e2e-{}-{nanos:x}", std::process::id()));
        // Private: it holds the administrator's token and the signing keys.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("etcd"))
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| e.to_string())?;

        // Certificates: one CA signs the apiserver's serving certificate; a key pair signs
        // service-account tokens; one token user is the administrator.
        let names: Vec<String> = ["127.0.0.1", "localhost", "10.0.0.1", "kubernetes.default.svc"]
            .map(str::to_owned)
            .to_vec();
        let bundle = crd_lifecycle::webhook::certs::new_bundle(&names, jiff::Timestamp::now())
            .map_err(|e| format!("cannot issue the apiserver's certificate: {e}"))?;
        write(&dir.join("ca.crt"), &bundle.ca_pem)?;
        write(&dir.join("apiserver.crt"), &bundle.cert_pem)?;
        write(&dir.join("apiserver.key"), &bundle.key_pem)?;
        let sa_key =
            rcgen::KeyPair::generate().map_err(|e| format!("cannot make a service-account key: {e}"))?;
        write(&dir.join("sa.key"), &sa_key.serialize_pem())?;
        write(&dir.join("sa.pub"), &sa_key.public_key_pem())?;
        let token = format!(
            "{:032x}",
            u128::from(nanos) * 0x9e37_79b9_7f4a_7c15 + u128::from(std::process::id())
        );
        write(
            &dir.join("tokens.csv"),
            &format!("{token},{ADMIN_TOKEN_USER},{ADMIN_TOKEN_USER},\"system:masters\"\n"),
        )?;

        let etcd_port = free_port()?;
        let apiserver_port = free_port()?;
        let kubeconfig = dir.join("kubeconfig");
        let ca_data = base64::engine::general_purpose::STANDARD.encode(&bundle.ca_pem);
        write(
            &kubeconfig,
            &serde_json::to_string_pretty(&json!({
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "e2e", "cluster": {
                    "server": format!("https://127.0.0.1:{apiserver_port}"),
                    "certificate-authority-data": ca_data}}],
                "users": [{"name": "e2e-admin", "user": {"token": token}}],
                "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e-admin"}}],
                "current-context": "e2e",
            }))
            .unwrap_or_default(),
        )?;

        let path = |name: &str| dir.join(name).display().to_string();
        let mut apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={apiserver_port}"),
            format!("--tls-cert-file={}", path("apiserver.crt")),
            format!("--tls-private-key-file={}", path("apiserver.key")),
            format!("--client-ca-file={}", path("ca.crt")),
            format!("--token-auth-file={}", path("tokens.csv")),
            "--authorization-mode=RBAC".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            format!("--service-account-key-file={}", path("sa.pub")),
            format!("--service-account-signing-key-file={}", path("sa.key")),
            "--allow-privileged=true".to_owned(),
        ];
        // The built-in StorageVersionMigration: beta (off by default) from 1.35; only where a
        // controller manager runs its svm controller (else migrations would hang Pending).
        if version >= (1, 35) && has_controller_manager {
            apiserver_args.push("--feature-gates=StorageVersionMigrator=true".to_owned());
            apiserver_args.push("--runtime-config=storagemigration.k8s.io/v1beta1=true".to_owned());
        }

        let plane = ControlPlane {
            assets: assets.to_path_buf(),
            version,
            etcd: Mutex::new(None),
            etcd_port,
            apiserver: Mutex::new(None),
            apiserver_args,
            controller_manager: Mutex::new(None),
            kubeconfig,
            stopped: std::sync::atomic::AtomicBool::new(false),
            dir,
        };
        plane.start_etcd().await?;
        plane.start_apiserver().await?;
        if has_controller_manager {
            plane.start_controller_manager().await?;
        }
        Ok(plane)
    }

    /// Starts kube-controller-manager again if it exited (as the kubelet restarts a static
    /// pod); returns how it had exited. v1.36.2 panics, for one, when a
    /// StorageVersionMigration's resource is unknown to it.
    pub async fn revive_controller_manager(&self) -> Option<String> {
        let exited = lock(&self.controller_manager)
            .as_mut()
            .and_then(|child| child.try_wait().ok().flatten())?;
        lock(&self.controller_manager).take();
        match self.start_controller_manager().await {
            Ok(()) => Some(exited.to_string()),
            Err(error) => Some(format!("{exited}; restarting it failed: {error}")),
        }
    }

    /// Where the processes' logs are (the benchmarks name it when one fails).
    #[allow(dead_code)]
    pub fn log_dir(&self) -> &Path {
        &self.dir
    }

    /// Whether a kube-controller-manager runs beside the apiserver.
    pub fn has_controller_manager(&self) -> bool {
        lock(&self.controller_manager).is_some()
    }

    async fn start_etcd(&self) -> Result<(), String> {
        let peer = free_port()?;
        let client_url = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut args = vec![
            format!("--data-dir={}", self.dir.join("etcd").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
        ];
        // Faster on a loaded machine; the flag exists from etcd 3.5.
        if etcd_version(&self.assets.join("etcd")) >= (3, 5) {
            args.push("--unsafe-no-fsync=true".to_owned());
        }
        let child = Command::new(self.assets.join("etcd"))
            .dies_with_parent()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log_file(&self.dir.join("etcd.log"))?)
            .spawn()
            .map_err(|e| format!("cannot start etcd: {e}"))?;
        *lock(&self.etcd) = Some(child);
        let started = Instant::now();
        loop {
            if let Ok((200, body)) = self.etcd().http("GET", "/health", None).await
                && body.contains("true")
            {
                return Ok(());
            }
            if let Some(child) = lock(&self.etcd).as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "etcd exited ({status}); log: {}",
                    self.dir.join("etcd.log").display()
                ));
            }
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!(
                    "etcd did not become healthy within 30 s (log: {})",
                    self.dir.join("etcd.log").display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn start_apiserver(&self) -> Result<(), String> {
        let child = Command::new(self.assets.join("kube-apiserver"))
            .dies_with_parent()
            .args(&self.apiserver_args)
            .stdout(Stdio::null())
            .stderr(log_file(&self.dir.join("kube-apiserver.log"))?)
            .spawn()
            .map_err(|e| format!("cannot start kube-apiserver: {e}"))?;
        *lock(&self.apiserver) = Some(child);
        self.wait_ready().await
    }

    /// Waits until `/readyz` answers 200 (at most 90 s).
    async fn wait_ready(&self) -> Result<(), String> {
        let client = self.client().await?;
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < Duration::from_secs(90) {
            if let Some(child) = lock(&self.apiserver).as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "kube-apiserver exited ({status}); log: {}",
                    self.dir.join("kube-apiserver.log").display()
                ));
            }
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            match client.request_text(request).await {
                Ok(_) => return Ok(()),
                Err(error) => last = error.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(format!(
            "kube-apiserver not ready within 90 s ({last}); log: {}",
            self.dir.join("kube-apiserver.log").display()
        ))
    }

    /// Starts kube-controller-manager and waits until it serves its port (at most 60 s).
    async fn start_controller_manager(&self) -> Result<(), String> {
        let kubeconfig = self.kubeconfig.display().to_string();
        let port = free_port()?;
        let mut args = vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            "--leader-elect=false".to_owned(),
            format!(
                "--service-account-private-key-file={}",
                self.dir.join("sa.key").display()
            ),
            format!("--root-ca-file={}", self.dir.join("ca.crt").display()),
        ];
        if self.version >= (1, 35) {
            args.push("--controllers=*,svm".to_owned());
            args.push("--feature-gates=StorageVersionMigrator=true".to_owned());
        }
        let child = Command::new(self.assets.join("kube-controller-manager"))
            .dies_with_parent()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log_file(&self.dir.join("kube-controller-manager.log"))?)
            .spawn()
            .map_err(|e| format!("cannot start kube-controller-manager: {e}"))?;
        *lock(&self.controller_manager) = Some(child);
        let log = self.dir.join("kube-controller-manager.log");
        let started = Instant::now();
        loop {
            if let Some(child) = lock(&self.controller_manager).as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "kube-controller-manager exited ({status}); log: {}",
                    log.display()
                ));
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "kube-controller-manager did not serve within 60 s; log: {}",
                    log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A client for the administrator.
    pub async fn client(&self) -> Result<kube::Client, String> {
        client_of(&self.kubeconfig).await
    }

    /// Stops the apiserver (SIGTERM, as a rolling restart does) and starts it again with
    /// the same flags; returns once it is ready.
    pub async fn restart_apiserver(&self) -> Result<(), String> {
        let running = lock(&self.apiserver).take();
        if let Some(mut child) = running {
            // Waiting for it to stop blocks: off the runtime's few worker threads.
            tokio::task::spawn_blocking(move || stop(&mut child, Duration::from_secs(20)))
                .await
                .map_err(|e| e.to_string())?;
        }
        self.start_apiserver().await
    }

    /// The control plane's etcd.
    pub fn etcd(&self) -> Etcd {
        Etcd { port: self.etcd_port }
    }

    /// Stops everything and removes its files (kept with `E2E_KEEP_CONTROL_PLANE=1`); once.
    pub fn stop(&self) {
        if self.stopped.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        for process in [&self.controller_manager, &self.apiserver, &self.etcd] {
            if let Some(mut child) = lock(process).take() {
                stop(&mut child, Duration::from_secs(10));
            }
        }
        if std::env::var("E2E_KEEP_CONTROL_PLANE").is_ok_and(|v| v == "1") {
            println!("e2e: control plane files kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A client of the control plane's etcd, through its JSON gateway (loopback, plain HTTP).
#[derive(Clone, Copy)]
pub struct Etcd {
    port: u16,
}

impl Etcd {
    /// Compacts etcd at its current revision: every continue token and watch resourceVersion
    /// issued before now expires (410), as after the apiserver's periodic compaction.
    pub async fn compact(&self) -> Result<i64, String> {
        let revision = self.revision().await?;
        let body = json!({"revision": revision.to_string(), "physical": true});
        match self.http("POST", "/v3/kv/compaction", Some(&body)).await? {
            (200, _) => Ok(revision),
            (code, text) => Err(format!("etcd compaction answered {code}: {text}")),
        }
    }

    /// etcd's current revision.
    pub async fn revision(&self) -> Result<i64, String> {
        let key = base64::engine::general_purpose::STANDARD.encode("/registry/");
        let (code, text) = self
            .http(
                "POST",
                "/v3/kv/range",
                Some(&json!({"key": key, "count_only": true})),
            )
            .await?;
        let answer: Value =
            serde_json::from_str(&text).map_err(|e| format!("etcd answered {code}: {e}: {text}"))?;
        answer["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .or_else(|| answer["header"]["revision"].as_i64())
            .ok_or_else(|| format!("etcd's answer has no revision: {text}"))
    }

    /// Every key under `prefix` and its value (JSON), e.g. every object of a resource
    /// (`/registry/<group>/<plural>/`), as stored.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, Value)>, String> {
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let engine = base64::engine::general_purpose::STANDARD;
        let (code, text) = self
            .http(
                "POST",
                "/v3/kv/range",
                Some(&json!({"key": engine.encode(prefix), "range_end": engine.encode(&end)})),
            )
            .await?;
        let answer: Value =
            serde_json::from_str(&text).map_err(|e| format!("etcd answered {code}: {e}: {text}"))?;
        let mut found = Vec::new();
        for kv in answer["kvs"].as_array().into_iter().flatten() {
            let decode = |field: &str| {
                engine
                    .decode(kv[field].as_str().unwrap_or_default())
                    .unwrap_or_default()
            };
            let key = String::from_utf8_lossy(&decode("key")).into_owned();
            let value = serde_json::from_slice(&decode("value")).unwrap_or(Value::Null);
            found.push((key, value));
        }
        Ok(found)
    }

    /// The value etcd stores under `key` (e.g. `/registry/<group>/<plural>/<name>`: a custom
    /// object as the apiserver encoded it, in the storage version of the moment it was
    /// written), `None` when there is none.
    pub async fn get(&self, key: &str) -> Result<Option<Value>, String> {
        let encoded = base64::engine::general_purpose::STANDARD.encode(key);
        let (code, text) = self
            .http("POST", "/v3/kv/range", Some(&json!({"key": encoded})))
            .await?;
        let answer: Value =
            serde_json::from_str(&text).map_err(|e| format!("etcd answered {code}: {e}: {text}"))?;
        let Some(value) = answer["kvs"][0]["value"].as_str() else {
            return Ok(None);
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(value)
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{key} is not stored as JSON: {e}"))
    }

    /// One request to etcd's JSON gateway (HTTP/1.0, so the body ends with the connection).
    pub async fn http(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, String), String> {
        tokio::time::timeout(Duration::from_secs(10), plain_http(self.port, method, path, body))
            .await
            .map_err(|_| format!("etcd {method} {path}: no answer within 10 s"))?
    }
}

/// A client of the kubeconfig at `path` (no connection open yet).
pub async fn client_of(path: &Path) -> Result<kube::Client, String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// One plain HTTP/1.0 request to a port on this machine (the body ends with the connection):
/// etcd's JSON gateway, a replica's `/readyz` and `/metrics`. The status code (0 when the
/// answer has none) and the body.
pub async fn plain_http(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_owned()))
}

/// Locks a mutex, whether or not a panicking holder poisoned it.
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Makes a child process die with the suite (even when the suite is killed), and sends
/// signals without a `kill` binary.
pub trait DiesWithParent {
    fn dies_with_parent(&mut self) -> &mut Self;
}

impl DiesWithParent for Command {
    fn dies_with_parent(&mut self) -> &mut Self {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            self.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        }
    }
}

/// Sends SIGTERM to a process.
pub fn sigterm(child: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: a plain system call on a pid we spawned.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}
