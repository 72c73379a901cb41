//! One accepted connection: its TLS handshake (bounded), HTTP/2 or HTTP/1.1 as ALPN
//! settled, asked to close gracefully at its maximum age or when the server stops, and
//! closed once its requests in flight are past their deadline (or, HTTP/1.1, once idle past
//! its grace).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use super::connections::Connections;
use super::in_flight::{Activity, Answer};
use crate::webhook::Readiness;
use crate::webhook::metrics::WebhookMetrics;

/// A TLS handshake not done within this is dropped (a client that connects and sends
/// nothing holds no task for long).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One accepted connection and what it needs to serve itself.
pub(super) struct Connection {
    pub(super) acceptor: TlsAcceptor,
    pub(super) app: Router,
    pub(super) http1: auto::Builder<TokioExecutor>,
    pub(super) http2: auto::Builder<TokioExecutor>,
    pub(super) stopped: watch::Receiver<bool>,
    pub(super) connections: Connections,
    pub(super) metrics: Arc<WebhookMetrics>,
    pub(super) readiness: Arc<Readiness>,
}

/// Counts a connection open while it lives.
struct Open(Arc<WebhookMetrics>);

impl Open {
    fn new(metrics: Arc<WebhookMetrics>) -> Open {
        metrics.open_connections.inc();
        Open(metrics)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open_connections.dec();
    }
}

impl Connection {
    pub(super) async fn serve(mut self, stream: tokio::net::TcpStream, peer: SocketAddr) {
        let _open = Open::new(self.metrics.clone());
        let Some(tls) = self.handshake(stream, peer).await else {
            return;
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        debug!(%peer, protocol = if h2 { "h2" } else { "http/1.1" }, "connection opened");
        let activity = Arc::new(Activity::new());
        let answer = Answer {
            router: TowerToHyperService::new(self.app.clone()),
            activity: activity.clone(),
            readiness: self.readiness.clone(),
        };
        let builder = if h2 { &self.http2 } else { &self.http1 };
        let connection = builder.serve_connection(TokioIo::new(tls), answer);
        let mut connection = std::pin::pin!(connection);
        let max_age = self.connections.max_age.map(|age| jittered(age, peer));
        let in_flight_deadline = self.connections.in_flight_deadline;
        let mut timer = if max_age.is_some() { Timer::Age } else { Timer::Off };
        let mut deadline = std::pin::pin!(tokio::time::sleep(max_age.unwrap_or_default()));
        let mut stopped = false;
        let mut idle_closed = false;
        loop {
            let closing = activity.closing.load(Ordering::SeqCst);
            tokio::select! {
                served = connection.as_mut() => {
                    match served {
                        Ok(()) => debug!(%peer, closing, "connection closed"),
                        Err(error) => debug!(%peer, error = %error, "connection ended with an error"),
                    }
                    return;
                }
                () = deadline.as_mut(), if timer != Timer::Off => match timer {
                    Timer::Age => {
                        debug!(%peer, "connection reached its maximum age; asking the client to reconnect");
                        self.metrics.connections_aged_out.inc();
                        activity.closing.store(true, Ordering::SeqCst);
                        timer = Timer::Off;
                        if h2 {
                            connection.as_mut().graceful_shutdown();
                            timer = Timer::CutOff;
                            deadline.as_mut().reset(tokio::time::Instant::now() + in_flight_deadline);
                        }
                    }
                    Timer::CutOff => {
                        // HTTP/2 after GOAWAY: open only for its streams in flight.
                        if h2 || activity.in_flight.load(Ordering::SeqCst) > 0 {
                            debug!(%peer, deadline = ?in_flight_deadline, "requests still in flight past their deadline; closing the connection");
                            return;
                        }
                        timer = Timer::Off;
                    }
                    Timer::Off => {}
                },
                () = stopping(&mut self.stopped), if !stopped => {
                    stopped = true;
                    if !closing {
                        activity.closing.store(true, Ordering::SeqCst);
                        if h2 {
                            connection.as_mut().graceful_shutdown();
                        }
                    }
                    // Requests in flight get their deadline (HTTP/2 past its age has one
                    // already); the server bounds the rest of the wait.
                    if timer != Timer::CutOff {
                        timer = Timer::CutOff;
                        deadline.as_mut().reset(tokio::time::Instant::now() + in_flight_deadline);
                    }
                }
                // An HTTP/1.1 connection asked to close closes after its next answer; one
                // its client leaves idle is closed only when no client would still use it.
                () = activity.idle_for(self.connections.idle_grace), if !h2 && closing && !idle_closed => {
                    debug!(%peer, grace = ?self.connections.idle_grace, "closing an HTTP/1.1 connection idle past its grace");
                    idle_closed = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

impl Connection {
    /// The TLS handshake, within `HANDSHAKE_TIMEOUT`; `None` (logged) when it fails or
    /// takes longer.
    async fn handshake(
        &self,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
    ) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
        // A handshake under way when the server stops is finished, not dropped: its client
        // dialled to send a request, which it gets answered (and is then asked to close).
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(stream)).await {
            Ok(Ok(tls)) => Some(tls),
            Ok(Err(error)) => {
                debug!(%peer, error = %error, "TLS handshake failed");
                None
            }
            Err(_) => {
                debug!(%peer, "TLS handshake not done within {HANDSHAKE_TIMEOUT:?}");
                None
            }
        }
    }
}

/// What a connection's timer is set for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Its maximum age.
    Age,
    /// The deadline of its requests in flight (after GOAWAY, or once the server stopped).
    CutOff,
    Off,
}

/// Completes once the server stops.
async fn stopping(stopped: &mut watch::Receiver<bool>) {
    // An error: the server is gone, which is a stop too.
    let _ = stopped.wait_for(|stopped| *stopped).await;
}

/// `age` give or take a tenth, different for every connection.
fn jittered(age: Duration, peer: SocketAddr) -> Duration {
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one((peer, std::time::Instant::now()));
    // A factor in [0.9, 1.1).
    let factor = 0.9 + (random % 2_000) as f64 / 10_000.0;
    age.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_ages_vary_by_a_tenth_at_most() {
        let age = Duration::from_secs(300);
        let peer: SocketAddr = ([10, 0, 0, 1], 44_123).into();
        let ages: Vec<Duration> = (0..200).map(|_| jittered(age, peer)).collect();
        assert!(
            ages.iter()
                .all(|a| *a >= age.mul_f64(0.9) && *a < age.mul_f64(1.1))
        );
        assert!(ages.iter().any(|a| *a != ages[0]), "not all the same");
    }
}
