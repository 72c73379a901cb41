//! A TCP load balancer on loopback in front of several webhook replicas, as a Service is: each
//! new connection goes to the next replica (round robin); a replica that refuses the connection
//! (stopped) is skipped, as a Service drops the endpoint of a pod that is gone. Bytes are
//! passed through untouched (TLS ends at the replica).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running balancer; stops when dropped.
pub struct Balancer {
    pub port: u16,
    task: JoinHandle<()>,
}

impl Balancer {
    /// Listens on a free port of `host` and spreads connections over `backends` (ports on
    /// this machine).
    pub async fn start(host: &str, backends: Vec<u16>) -> Result<Balancer, String> {
        let listener = TcpListener::bind((host, 0))
            .await
            .map_err(|e| format!("balancer: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let next = Arc::new(AtomicUsize::new(0));
        let backends = Arc::new(backends);
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let (next, backends) = (next.clone(), backends.clone());
                tokio::spawn(async move {
                    let start = next.fetch_add(1, Ordering::Relaxed);
                    for offset in 0..backends.len() {
                        let backend = backends[(start + offset) % backends.len()];
                        if let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", backend)).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                            return;
                        }
                    }
                });
            }
        });
        Ok(Balancer { port, task })
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
