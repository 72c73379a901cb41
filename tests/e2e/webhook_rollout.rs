//! Scenario 12: a rollout of the conversion webhook under a conversion-heavy client. Two
//! webhook replicas (`crd-lifecycle webhook`, one CA, short drain and connection age) sit
//! behind the suite's balancer playing the Service (`balancer`): each new connection goes to
//! a replica whose `/readyz` answered 200 at the last probe (every 200 ms, as endpoints
//! follow readiness), and one that refuses it is not passed over (the client sees it).
//! The CRD converts through the balancer; readers LIST and GET every object through the
//! converted version in a loop (a GET is converted every time; v1.36 converts a LIST's
//! objects from its watch cache once per resourceVersion) while each replica in turn gets
//! SIGTERM and is replaced. No read may fail, every object must read converted, and each
//! replica must exit cleanly: after its drain, once the apiserver closed the HTTP/1.1
//! connections it kept idle (it speaks HTTP/1.1 to webhooks, HTTP/2 only to a loopback URL
//! from 1.30 on) or their grace ran out. The readers read on until then.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::balancer::{Backend, Balancer, OnRefused, Readyz};
use crate::control_plane::free_port;
use crate::ensure;
use crate::env::{Env, Outcome, TestCrd, wait_for};

const OBJECTS: usize = 200;
const READERS: usize = 4;
/// Short, so that the scenario is quick; the balancer's probes are far more frequent.
const DRAIN: &str = "3s";
/// Longer than the drain, so that a replica usually has the apiserver's connection open
/// when it stops (GOAWAY at the drain's end), and short enough that connections are also
/// recycled while the readers run.
const MAX_CONNECTION_AGE: &str = "10s";
/// A connection younger than this at SIGTERM is still open when the drain ends (it ages
/// out 9 s after it was made at the earliest; the drain is 3 s).
const YOUNG: Duration = Duration::from_secs(4);
/// How long a replica may take to exit after SIGTERM: the drain (3 s), requests in flight
/// (15 s) and the default grace of idle HTTP/1.1 connections (100 s), and a margin.
const EXIT_WITHIN: Duration = Duration::from_secs(130);

/// One `crd-lifecycle webhook` process.
struct Replica {
    name: String,
    port: u16,
    child: Child,
    log: std::path::PathBuf,
}

impl Replica {
    /// Starts replica `name`, logging to `<log_prefix>-<name>.log`.
    fn start(name: &str, dir: &std::path::Path, log_prefix: &str) -> Result<Replica, String> {
        let log_path = std::path::PathBuf::from(format!("{log_prefix}-{name}.log"));
        let port = free_port()?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| e.to_string())?;
        let path = |file: &str| dir.join(file).to_string_lossy().into_owned();
        let child = Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"))
            .args([
                "webhook",
                "--port",
                &port.to_string(),
                "--policy",
                &path("policy.yaml"),
            ])
            .args(["--cert-file", &path("tls.crt"), "--key-file", &path("tls.key")])
            .args(["--drain", DRAIN, "--max-connection-age", MAX_CONNECTION_AGE])
            .env("RUST_LOG", "info,crd_lifecycle::webhook=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start webhook {name}: {e}"))?;
        Ok(Replica {
            name: name.to_owned(),
            port,
            child,
            log: log_path,
        })
    }

    /// As the balancer sees it: `/readyz` on its webhook port, over TLS.
    fn backend(&self, ca_pem: &str) -> Backend {
        Backend {
            webhook: self.port,
            readyz: Readyz::Https {
                ca_pem: ca_pem.to_owned(),
            },
        }
    }

    /// What the kubelet does to a pod being replaced.
    fn terminate(&self) -> Outcome {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .map_err(|e| e.to_string())?;
        ensure!(status.success(), "kill -TERM {} failed", self.child.id());
        Ok(())
    }

    /// Waits for the process to exit; it must exit cleanly.
    async fn exited(&mut self, limit: Duration) -> Outcome {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                ensure!(status.success(), "webhook {} exited with {status}", self.name);
                return Ok(());
            }
            ensure!(
                started.elapsed() < limit,
                "webhook {} still runs {limit:?} after SIGTERM",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Replica {
    /// Waits until its drain is over: it stopped accepting (from its log).
    async fn drained(&self, limit: Duration) -> Outcome {
        wait_for(
            &format!("webhook {} stops accepting after its drain", self.name),
            limit,
            || async {
                Ok(std::fs::read_to_string(&self.log).is_ok_and(|log| log.contains("stopped accepting")))
            },
        )
        .await
        .map(|_| ())
    }

    /// Whether a client spoke HTTP/2 to it: the apiserver (the balancer's probes speak
    /// HTTP/1.1), from its log.
    fn spoke_http2(&self) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|log| log.contains("protocol=\"h2\""))
    }

    /// How many connections it asked to close when it stopped accepting (from its log).
    fn connections_at_stop(&self) -> Option<usize> {
        let log = std::fs::read_to_string(&self.log).ok()?;
        let line = log.lines().find(|l| l.contains("stopped accepting"))?;
        line.split("connections=")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the replica has a connection in use (open for a second: the apiserver closes a
/// connection it dialled twice at once right away) that was made less than `YOUNG` ago, so
/// that it will not reach its maximum age before the drain ends.
fn has_connection_in_use(balancer: &Balancer, port: u16) -> bool {
    balancer
        .open_since(port)
        .iter()
        .any(|at| at.elapsed() >= Duration::from_secs(1) && at.elapsed() < YOUNG)
}

pub async fn webhook_rollout(env: &Env) -> Outcome {
    let crd = env
        .create_crd("rollout", &[("v1", true, true), ("v2", true, false)])
        .await?;
    let dir = std::env::temp_dir().join(format!("crd-lifecycle-{}-rollout", env.run_id));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let outcome = rollout(env, &crd, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

async fn rollout(env: &Env, crd: &TestCrd, dir: &std::path::Path) -> Outcome {
    // One CA and serving certificate for every replica, as a shared Secret gives them.
    let host = std::env::var("E2E_WEBHOOK_HOST").unwrap_or_else(|_| "127.0.0.1".to_owned());
    let names = vec![host.clone(), "127.0.0.1".to_owned()];
    let bundle = crd_lifecycle::webhook::certs::new_bundle(&names, jiff::Timestamp::now())
        .map_err(|e| e.to_string())?;
    let policy_name = format!("{}-rollout", env.run_id);
    let policy = json!({
        "apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
        "metadata": {"name": policy_name},
        "spec": {"crdName": crd.name, "versions": [{"name": "v1"}, {"name": "v2"}],
                 "conversion": {"changes": [{"from": "v1", "to": "v2",
                     "renamed": [{"from": "spec.size", "to": "spec.replicas"}]}]}},
    });
    for (file, text) in [
        ("tls.crt", bundle.cert_pem.clone()),
        ("tls.key", bundle.key_pem.clone()),
        ("policy.yaml", policy.to_string()),
    ] {
        std::fs::write(dir.join(file), text).map_err(|e| e.to_string())?;
    }
    let log = std::env::temp_dir()
        .join(format!("crd-lifecycle-{}-webhook", env.run_id))
        .to_string_lossy()
        .into_owned();
    println!("e2e: webhook_rollout: webhook logs {log}-<replica>.log");
    let mut a = Replica::start("a", dir, &log)?;
    let mut b = Replica::start("b", dir, &log)?;
    let balancer = Balancer::start(
        if host == "127.0.0.1" {
            "127.0.0.1"
        } else {
            "0.0.0.0"
        },
        vec![a.backend(&bundle.ca_pem), b.backend(&bundle.ca_pem)],
        OnRefused::Close,
        Some("e2e: webhook_rollout: balancer"),
    )
    .await?;
    let setup = Setup {
        env,
        crd,
        url: format!("https://{host}:{}/convert/{policy_name}", balancer.port),
        ca_pem: bundle.ca_pem.clone(),
        balancer: &balancer,
        dir,
        log: &log,
    };
    setup.drive(&mut a, &mut b).await
}

/// What the rollout runs against.
struct Setup<'a> {
    env: &'a Env,
    crd: &'a TestCrd,
    /// The CRD's conversion webhook: the balancer.
    url: String,
    ca_pem: String,
    balancer: &'a Balancer,
    dir: &'a std::path::Path,
    log: &'a str,
}

impl Setup<'_> {
    async fn drive(&self, a: &mut Replica, b: &mut Replica) -> Outcome {
        let (env, crd, balancer) = (self.env, self.crd, self.balancer);
        wait_for(
            "both webhook replicas are ready",
            Duration::from_secs(30),
            || async { Ok(balancer.ready().len() == 2) },
        )
        .await?;
        // The CRD converts through the balancer, trusting the replicas' CA.
        let api: Api<CustomResourceDefinition> = Api::all(env.client.clone());
        let conversion = json!({"spec": {"conversion": {"strategy": "Webhook", "webhook": {
        "conversionReviewVersions": ["v1"],
        "clientConfig": {"url": self.url,
                         "caBundle": k8s_openapi::ByteString(self.ca_pem.as_bytes().to_vec())}}}}});
        api.patch(&crd.name, &PatchParams::default(), &Patch::Merge(&conversion))
            .await
            .map_err(|e| e.to_string())?;
        env.create_objects(crd, "v1", OBJECTS).await?;
        wait_for(
            "a LIST converts through the webhook",
            Duration::from_secs(30),
            || async {
                Ok(env
                    .list_via(crd, "v2")
                    .await
                    .is_ok_and(|objects| objects.len() == OBJECTS))
            },
        )
        .await?;

        // Readers: every object through v2, over and over, each one checked.
        let reading = Arc::new(AtomicBool::new(true));
        let lists = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::<String>::new()));
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (client, crd) = (
                    env.clone_client(),
                    TestCrd {
                        name: crd.name.clone(),
                        group: crd.group.clone(),
                    },
                );
                let (reading, lists, failures) = (reading.clone(), lists.clone(), failures.clone());
                tokio::spawn(async move {
                    while reading.load(Ordering::Relaxed) {
                        match list_v2(&client, &crd).await {
                            Ok(()) => {
                                lists.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(error) => failures.lock().expect("lock").push(error),
                        }
                    }
                })
            })
            .collect();
        let settle = |what: &'static str| {
            let lists = lists.clone();
            async move {
                let from = lists.load(Ordering::Relaxed);
                wait_for(what, Duration::from_secs(60), || async {
                    Ok(lists.load(Ordering::Relaxed) >= from + 2 * READERS)
                })
                .await
            }
        };
        settle("the readers list through both replicas").await?;

        // The rollout: A is replaced by C, then B by D, each with SIGTERM while reads run.
        let mut c = self.replace(a, "c").await?;
        settle("the readers read after a's drain").await?;
        let mut d = self.replace(b, "d").await?;
        settle("the readers read after b's drain").await?;
        // A and B serve on, on the connections the apiserver keeps, until it closes them.
        a.exited(EXIT_WITHIN).await?;
        b.exited(EXIT_WITHIN).await?;
        for old in [&*a, &*b] {
            balancer.remove(old.port);
        }
        settle("the readers read after a's and b's exits").await?;
        reading.store(false, Ordering::Relaxed);
        for reader in readers {
            let _ = reader.await;
        }
        let failures = failures.lock().expect("lock").clone();
        let connections = balancer.connections();
        println!(
            "e2e: webhook_rollout: {} passes (a LIST and {OBJECTS} GETs through v2), {} failed; connections per replica port: {connections:?}",
            lists.load(Ordering::Relaxed),
            failures.len()
        );
        ensure!(
            failures.is_empty(),
            "{} reads failed during the rollout, first: {}",
            failures.len(),
            failures[0]
        );
        // The replicas that took over were used: connections moved over to them.
        ensure!(
            connections.get(&c.port).is_some_and(|n| *n > 0)
                && connections.get(&d.port).is_some_and(|n| *n > 0),
            "the new replicas got no connection: {connections:?}"
        );
        c.terminate()?;
        d.terminate()?;
        c.exited(EXIT_WITHIN).await?;
        d.exited(EXIT_WITHIN).await
    }

    /// Starts `name`, waits until it is ready and `old` holds the apiserver's connection,
    /// then stops `old` as the kubelet does (SIGTERM) and waits for its drain to end with
    /// that connection still open, asked to close (HTTP/2 GOAWAY, HTTP/1.1 `Connection:
    /// close` on its next answer).
    async fn replace(&self, old: &mut Replica, name: &str) -> Result<Replica, String> {
        let balancer = self.balancer;
        let new = Replica::start(name, self.dir, self.log)?;
        balancer.add(new.backend(&self.ca_pem));
        wait_for(
            &format!("replica {name} is ready"),
            Duration::from_secs(30),
            || async { Ok(balancer.ready().contains(&new.port)) },
        )
        .await?;
        // The apiserver's next connection goes to the replica about to stop (round robin alone
        // may pass it over for minutes: the apiserver holds one connection per 10 s and dials
        // some twice, closing one at once).
        balancer.steer(Some(old.port));
        let connected = wait_for(
            &format!("the apiserver connects to replica {}", old.name),
            Duration::from_secs(90),
            || async { Ok(has_connection_in_use(balancer, old.port)) },
        )
        .await;
        balancer.steer(None);
        connected?;
        old.terminate()?;
        old.drained(Duration::from_secs(30)).await?;
        let at_stop = old.connections_at_stop();
        let h2 = old.spoke_http2();
        println!(
            "e2e: webhook_rollout: replica {} drained ({}): {at_stop:?} connections open at the drain's end",
            old.name,
            if h2 {
                "the apiserver spoke HTTP/2"
            } else {
                "the apiserver spoke HTTP/1.1"
            }
        );
        // Over HTTP/2 the apiserver's one connection is still open when the drain ends, and
        // gets GOAWAY then. Over HTTP/1.1 each connection it used during the drain was told
        // `Connection: close` and closed after that answer; those it left idle stay open
        // for it to close, and there may be none.
        ensure!(
            !h2 || at_stop.is_some_and(|n| n > 0),
            "replica {} had no connection to close when its drain ended ({at_stop:?}, log {})",
            old.name,
            old.log.display()
        );
        Ok(new)
    }
}

/// Every object through v2, each converted (`spec.replicas`, no `spec.size`): a LIST,
/// then a GET of each (the apiserver converts a GET's object every time; a LIST's objects
/// served from its watch cache are converted once per resourceVersion).
async fn list_v2(client: &kube::Client, crd: &TestCrd) -> Outcome {
    let request = http::Request::get(format!("/apis/{}/v2/widgets?limit=500", crd.group))
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let list: Value = client.request(request).await.map_err(|e| e.to_string())?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    ensure!(
        items.len() == OBJECTS,
        "{} objects listed, {OBJECTS} stored",
        items.len()
    );
    for item in &items {
        check(crd, item)?;
    }
    for i in 0..OBJECTS {
        let request = http::Request::get(format!("/apis/{}/v2/widgets/w{i:05}", crd.group))
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let item: Value = client.request(request).await.map_err(|e| e.to_string())?;
        check(crd, &item)?;
    }
    Ok(())
}

fn check(crd: &TestCrd, item: &Value) -> Outcome {
    let name = item["metadata"]["name"].as_str().unwrap_or_default();
    let i: usize = name.trim_start_matches('w').parse().unwrap_or(usize::MAX);
    ensure!(
        item["apiVersion"] == format!("{}/v2", crd.group)
            && item["spec"] == json!({"replicas": i, "color": "blue"}),
        "{name} read through v2 as {item}"
    );
    Ok(())
}
