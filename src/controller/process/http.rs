//! `/healthz`, `/readyz` and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::controller::metrics::Metrics;

/// Liveness and readiness, set by the controller's tasks.
#[derive(Default)]
pub struct Health {
    /// False once a task the process depends on has died.
    pub alive: AtomicBool,
    /// True once the apiserver answered and the controller (or the standby loop) runs.
    pub ready: AtomicBool,
    /// The conversion webhook's readiness, when this replica serves it: `/readyz` is ready
    /// only when both are (the webhook's Service selects these pods by readiness).
    pub webhook: Option<Arc<crate::webhook::Readiness>>,
}

impl Health {
    /// What `/readyz` answers: `Ok` for 200 `ok`, else the body of its 503 (`not ok`, with
    /// the conversion webhook's reason when it is the webhook that is not ready).
    pub fn readiness(&self) -> Result<(), String> {
        if !self.ready.load(Ordering::Relaxed) {
            return Err("not ok".to_owned());
        }
        match self.webhook.as_ref().map(|webhook| webhook.check()) {
            Some(Err(why)) => Err(format!("not ok: the conversion webhook is not ready: {why}")),
            _ => Ok(()),
        }
    }
}

#[derive(Clone)]
struct ServerState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The router, separate from binding so that tests can call it directly.
pub fn router(metrics: Arc<Metrics>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(ServerState { metrics, health })
}

/// Serves until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let address = listener.local_addr()?;
    tracing::info!(%address, "serving /healthz, /readyz and /metrics");
    axum::serve(listener, router(metrics, health))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn healthz(State(state): State<ServerState>) -> impl IntoResponse {
    probe(state.health.alive.load(Ordering::Relaxed))
}

async fn readyz(State(state): State<ServerState>) -> impl IntoResponse {
    match state.health.readiness() {
        Ok(()) => probe(true).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

fn probe(ok: bool) -> (StatusCode, &'static str) {
    if ok {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ok\n")
    }
}

async fn metrics_text(State(state): State<ServerState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}
