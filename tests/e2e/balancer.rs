//! A TCP load balancer on loopback in front of several webhook replicas, as a Service is: each
//! new connection goes to the next **ready** replica (round robin), ready meaning its
//! `/readyz` answered 200 at the last probe (every 200 ms, as endpoints follow readiness: a
//! replica started or restarted mid-rotation serves no certificate and is not Ready until it
//! does); a replica that refuses the connection (stopped) is skipped, as a Service drops the
//! endpoint of a pod that is gone; with no ready replica the connection is closed, as a
//! Service without endpoints refuses it. Bytes are passed through untouched (TLS ends at the
//! replica).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::env::lock;

/// A running balancer; stops when dropped.
pub struct Balancer {
    pub port: u16,
    tasks: Vec<JoinHandle<()>>,
}

/// One replica: the port it serves the webhook on, and the port of its `/readyz`.
#[derive(Clone, Copy, Debug)]
pub struct Backend {
    pub webhook: u16,
    pub health: u16,
}

impl Balancer {
    /// Listens on a free port of `host` and spreads connections over the ready `backends`.
    pub async fn start(host: &str, backends: Vec<Backend>) -> Result<Balancer, String> {
        let listener = TcpListener::bind((host, 0))
            .await
            .map_err(|e| format!("balancer: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let ready: Arc<Mutex<Vec<u16>>> = Arc::default();
        let probing = {
            let ready = ready.clone();
            tokio::spawn(async move {
                loop {
                    let mut now = Vec::new();
                    for backend in &backends {
                        if is_ready(backend.health).await {
                            now.push(backend.webhook);
                        }
                    }
                    *lock(&ready) = now;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
        };
        let next = Arc::new(AtomicUsize::new(0));
        let accepting = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let (next, ready) = (next.clone(), ready.clone());
                tokio::spawn(async move {
                    let ready = lock(&ready).clone();
                    let start = next.fetch_add(1, Ordering::Relaxed);
                    for offset in 0..ready.len() {
                        let backend = ready[(start + offset) % ready.len()];
                        if let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", backend)).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                            return;
                        }
                    }
                });
            }
        });
        Ok(Balancer {
            port,
            tasks: vec![probing, accepting],
        })
    }
}

/// Whether a replica's `/readyz` answers 200 (a new connection per probe, as the kubelet's).
async fn is_ready(health: u16) -> bool {
    let probe = crate::control_plane::plain_http(health, "GET", "/readyz", None);
    matches!(
        tokio::time::timeout(Duration::from_secs(1), probe).await,
        Ok(Ok((200, _)))
    )
}

impl Drop for Balancer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
