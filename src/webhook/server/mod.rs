//! HTTPS serving with certificates that can be replaced while running (rotation).
//!
//! - `cert_store`: the serving certificate, replaceable at any time;
//! - `routes`: `POST /convert/<policy>` (answered inline or on the blocking pool),
//!   `/healthz`, `/readyz`; `review_body`: a review's body read within the size limit;
//! - `connections`: how connections age and how the webhook stops (the settings);
//!   `connection`: one accepted connection served, aged out and closed; `in_flight`: its
//!   requests in flight, and `Connection: close` once it is asked to close;
//! - here: the `Server`, accepting until it stops, and the drain after SIGTERM.

mod cert_store;
mod connection;
mod connections;
mod in_flight;
mod review_body;
mod routes;

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

pub use cert_store::CertStore;
pub use connections::{Connections, DEFAULT_DRAIN, DEFAULT_IN_FLIGHT_DEADLINE, DEFAULT_MAX_CONNECTION_AGE};

use cert_store::Resolver;
use connection::Connection;
use routes::router;

use crate::webhook::metrics::WebhookMetrics;
use crate::webhook::{Limits, PolicySource, Readiness};

/// The conversion webhook's HTTPS server.
pub struct Server {
    pub certs: Arc<CertStore>,
    pub policies: Arc<dyn PolicySource>,
    pub metrics: Arc<WebhookMetrics>,
    pub limits: Limits,
    /// What `/readyz` answers.
    pub readiness: Arc<Readiness>,
    pub connections: Connections,
}

/// Completes `drain` after `signal`, having marked `readiness` draining when `signal`
/// completed: the `stop` of [`Server::serve`] for a process that got SIGTERM.
pub async fn drain_after(signal: impl Future<Output = ()>, readiness: Arc<Readiness>, drain: Duration) {
    signal.await;
    readiness.begin_drain();
    info!(
        drain = ?drain,
        "draining the conversion webhook: not ready, still serving until endpoints drop this replica"
    );
    tokio::time::sleep(drain).await;
}
impl Server {
    /// Serves HTTPS on `listener` until `stop` completes. Then the listener closes (new
    /// connections are refused) and every connection is asked to close gracefully, never
    /// under a request its client may have sent: HTTP/2 gets GOAWAY (the client sends its
    /// next requests elsewhere, the streams in flight finish); an HTTP/1.1 connection
    /// answers its next request with `Connection: close` (from the drain's start on, see
    /// [`Readiness::is_draining`]) and, idle, is left for its client to close, for up to
    /// `idle_grace` of idleness. Requests in flight get `in_flight_deadline`; whatever is
    /// still open after [`Connections::closing_deadline`] is closed.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        stop: impl Future<Output = ()> + Send,
    ) -> std::io::Result<()> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(self.certs)));
        // HTTP/2 first, as the apiserver's client prefers it where it offers it (a loopback
        // URL, from Kubernetes 1.30 on); HTTP/1.1 for other clients, the apiserver's
        // webhook client included (it offers only http/1.1 for any other URL).
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        info!(address = %listener.local_addr()?, "serving the conversion webhook (HTTPS /convert/<policy>)");
        let app = router(
            self.policies,
            self.metrics.clone(),
            self.limits,
            self.readiness.clone(),
        );
        // The protocol is the one ALPN settled on (no ALPN: HTTP/1.1, as RFC 9113 allows
        // HTTP/2 over TLS only through ALPN), never guessed from the first bytes: a
        // connection still guessing when asked to close would be dropped at once.
        let http1 = auto::Builder::new(TokioExecutor::new()).http1_only();
        let http2 = auto::Builder::new(TokioExecutor::new()).http2_only();
        let connections = self.connections;
        // Told to every connection when the server stops.
        let (stopping, stopped) = watch::channel(false);
        let mut open = JoinSet::new();
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let connection = Connection {
                            acceptor: acceptor.clone(),
                            app: app.clone(),
                            http1: http1.clone(),
                            http2: http2.clone(),
                            stopped: stopped.clone(),
                            connections,
                            metrics: self.metrics.clone(),
                            readiness: self.readiness.clone(),
                        };
                        open.spawn(connection.serve(stream, peer));
                    }
                    Err(error) => warn!(error = %error, "accept failed"),
                },
                // Finished connections are reaped as they go.
                Some(_) = open.join_next(), if !open.is_empty() => {}
                () = &mut stop => break,
            }
        }
        drop(listener);
        info!(
            connections = open.len(),
            "the conversion webhook stopped accepting; asking its connections to close (HTTP/2 GOAWAY; HTTP/1.1 Connection: close, idle ones left to their clients)"
        );
        let _ = stopping.send(true);
        let all_closed = async { while open.join_next().await.is_some() {} };
        let deadline = connections.closing_deadline();
        if tokio::time::timeout(deadline, all_closed).await.is_err() {
            warn!(
                connections = open.len(),
                deadline = ?deadline,
                "connections still open at the deadline; closing them"
            );
            open.shutdown().await;
        }
        info!("the conversion webhook stopped");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_drain_reports_not_ready_at_the_signal_and_ends_after_its_period() {
        let readiness = Arc::new(Readiness::ready());
        let (signal, signalled) = tokio::sync::oneshot::channel::<()>();
        let drain = tokio::spawn(drain_after(
            async {
                let _ = signalled.await;
            },
            readiness.clone(),
            Duration::from_secs(10),
        ));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(readiness.check(), Ok(()), "ready until the signal");
        assert!(!drain.is_finished());
        let signalled_at = tokio::time::Instant::now();
        let _ = signal.send(());
        tokio::task::yield_now().await;
        assert!(readiness.is_draining(), "not ready at once");
        tokio::time::sleep(Duration::from_millis(9_999)).await;
        assert!(!drain.is_finished(), "still serving during the drain");
        drain.await.expect("drained");
        assert_eq!(signalled_at.elapsed(), Duration::from_secs(10));
    }
}
