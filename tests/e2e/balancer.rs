//! A TCP load balancer on loopback in front of several webhook replicas, as a Service is
//! (`webhook_rollout`, `soak`). Each new connection goes to the next **ready** replica (round
//! robin), ready meaning its `/readyz` answered 200 at the last probe (every 200 ms, a new
//! connection per probe, as the kubelet's: endpoints follow readiness; a replica started or
//! restarted mid-rotation serves no certificate and is not Ready until it does). With no
//! ready replica the connection is closed, as a Service without endpoints refuses it. Bytes
//! are passed through untouched (TLS ends at the replica).
//!
//! What a connection gets when its replica refuses it is the scenario's choice
//! ([`OnRefused`]). The balancer counts the connections made to each replica and knows which
//! are open and since when; a scenario may add and remove replicas, and steer new
//! connections to one of them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::env::lock;
use crate::webhook_client::{Client, Served};

/// One replica: the port it serves the webhook on, and how to ask whether it is Ready.
#[derive(Clone, Debug)]
pub struct Backend {
    pub webhook: u16,
    pub readyz: Readyz,
}

/// Where a replica answers `/readyz`.
#[derive(Clone, Debug)]
pub enum Readyz {
    /// Plain HTTP on a port of its own (`crd-lifecycle run`'s `--metrics-addr`); no answer
    /// within 1 s is not Ready.
    Http(u16),
    /// HTTPS on the webhook's port, trusting `ca_pem` (`crd-lifecycle webhook`).
    Https { ca_pem: String },
}

/// What a new connection gets when the ready replica picked for it refuses it.
#[derive(Clone, Copy, Debug)]
pub enum OnRefused {
    /// The next ready replica, as a Service drops the endpoint of a pod that is gone (the soak
    /// kills replicas without a drain, faster than a probe notices).
    NextReady,
    /// Closed: a replica that stops accepting while still Ready makes the client fail (the
    /// rollout checks that a draining replica stops being Ready first).
    Close,
}

/// A running balancer; stops when dropped.
pub struct Balancer {
    pub port: u16,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    backends: Mutex<Vec<Backend>>,
    /// Webhook ports of the replicas Ready at the last probe, in the order of `backends`.
    ready: Mutex<Vec<u16>>,
    /// Round robin, and each connection's id.
    next: AtomicUsize,
    /// While set and Ready, the replica every new connection goes to.
    steer: Mutex<Option<u16>>,
    /// Connections made to each replica, by webhook port.
    connections: Mutex<BTreeMap<u16, usize>>,
    /// Connections open now: id, webhook port, when made.
    open: Mutex<Vec<(usize, u16, Instant)>>,
}

impl Balancer {
    /// Listens on a free port of `listen` and spreads connections over the ready `backends`.
    /// With `log_as`, it prints a line starting with it for each connection it could not pass
    /// on or that ended in an error.
    pub async fn start(
        listen: &str,
        backends: Vec<Backend>,
        on_refused: OnRefused,
        log_as: Option<&'static str>,
    ) -> Result<Balancer, String> {
        let listener = TcpListener::bind((listen, 0))
            .await
            .map_err(|e| format!("balancer: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let shared = Arc::new(Shared {
            backends: Mutex::new(backends),
            ..Shared::default()
        });
        let probing = tokio::spawn(probe(shared.clone()));
        let accepting = {
            let shared = shared.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(pass_on(shared.clone(), client, on_refused, log_as));
                }
            })
        };
        Ok(Balancer {
            port,
            shared,
            tasks: vec![probing, accepting],
        })
    }

    /// A replica more, Ready once a probe says so.
    pub fn add(&self, backend: Backend) {
        lock(&self.shared.backends).push(backend);
    }

    /// No longer probed, and no longer Ready after the next probe.
    pub fn remove(&self, webhook: u16) {
        lock(&self.shared.backends).retain(|b| b.webhook != webhook);
    }

    /// Webhook ports of the replicas Ready at the last probe.
    pub fn ready(&self) -> Vec<u16> {
        lock(&self.shared.ready).clone()
    }

    /// While `Some` and Ready, every new connection goes to that replica; `None`: round robin.
    pub fn steer(&self, webhook: Option<u16>) {
        *lock(&self.shared.steer) = webhook;
    }

    /// Connections made to each replica so far, by webhook port.
    pub fn connections(&self) -> BTreeMap<u16, usize> {
        lock(&self.shared.connections).clone()
    }

    /// When each connection open now to a replica was made.
    pub fn open_since(&self, webhook: u16) -> Vec<Instant> {
        lock(&self.shared.open)
            .iter()
            .filter(|(_, port, _)| *port == webhook)
            .map(|(_, _, at)| *at)
            .collect()
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Probes every replica every 200 ms, one after another.
async fn probe(shared: Arc<Shared>) {
    loop {
        let backends = lock(&shared.backends).clone();
        let mut ready = Vec::new();
        for backend in backends {
            if is_ready(&backend).await {
                ready.push(backend.webhook);
            }
        }
        *lock(&shared.ready) = ready;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether a replica's `/readyz` answers 200 (a new connection per probe, as the kubelet's).
async fn is_ready(backend: &Backend) -> bool {
    match &backend.readyz {
        Readyz::Http(port) => {
            let probe = crate::control_plane::plain_http(*port, "GET", "/readyz", None);
            matches!(
                tokio::time::timeout(Duration::from_secs(1), probe).await,
                Ok(Ok((200, _)))
            )
        }
        Readyz::Https { ca_pem } => {
            let served = Served::external(backend.webhook, ca_pem.clone());
            match Client::try_connect(&served, &[b"http/1.1"]).await {
                Ok(mut client) => matches!(client.try_get("/readyz").await, Ok((200, _))),
                Err(_) => false,
            }
        }
    }
}

/// Passes one client's connection on to a ready replica, until either side closes it.
async fn pass_on(
    shared: Arc<Shared>,
    mut client: TcpStream,
    on_refused: OnRefused,
    log_as: Option<&'static str>,
) {
    let say = |line: String| {
        if let Some(prefix) = log_as {
            println!("{prefix}: {line}");
        }
    };
    let ready = lock(&shared.ready).clone();
    if ready.is_empty() {
        say("no ready replica for a new connection; closed it".to_owned());
        return;
    }
    let id = shared.next.fetch_add(1, Ordering::Relaxed);
    let first = lock(&shared.steer)
        .and_then(|port| ready.iter().position(|p| *p == port))
        .unwrap_or(id % ready.len());
    let tries = match on_refused {
        OnRefused::NextReady => ready.len(),
        OnRefused::Close => 1,
    };
    for offset in 0..tries {
        let port = ready[(first + offset) % ready.len()];
        match TcpStream::connect(("127.0.0.1", port)).await {
            Ok(mut upstream) => {
                *lock(&shared.connections).entry(port).or_default() += 1;
                lock(&shared.open).push((id, port, Instant::now()));
                if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                    say(format!("connection to replica port {port}: {error}"));
                }
                lock(&shared.open).retain(|(open, _, _)| *open != id);
                return;
            }
            Err(error) => say(format!("cannot connect to replica port {port}: {error}")),
        }
    }
}
