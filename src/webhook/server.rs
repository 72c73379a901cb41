//! HTTPS serving with certificates that can be replaced while running (rotation).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use super::PolicySource;
use super::metrics::WebhookMetrics;

/// The serving certificate, replaceable at any time.
#[derive(Debug, Default)]
pub struct CertStore {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl CertStore {
    /// Installs a certificate chain and key (PEM).
    pub fn set_pem(&self, cert_pem: &str, key_pem: &str) -> Result<(), String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("invalid certificate PEM: {e}"))?;
        if chain.is_empty() {
            return Err("no certificate in the PEM".to_owned());
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("invalid key PEM: {e}"))?;
        let signing_key = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| format!("unsupported key: {e}"))?;
        let certified = Arc::new(CertifiedKey::new(chain, signing_key));
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(certified);
        Ok(())
    }

    pub fn is_ready(&self) -> bool {
        self.current.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

#[derive(Debug)]
struct Resolver(Arc<CertStore>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Clone)]
struct WebhookState {
    policies: Arc<dyn PolicySource>,
    metrics: Arc<WebhookMetrics>,
}

/// `POST /convert/<policy>` and `GET /healthz`; every review is counted in `metrics`.
pub fn router(policies: Arc<dyn PolicySource>, metrics: Arc<WebhookMetrics>) -> Router {
    Router::new()
        .route("/convert/{policy}", post(convert))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(WebhookState { policies, metrics })
}

async fn convert(
    State(state): State<WebhookState>,
    Path(policy): Path<String>,
    body: Bytes,
) -> impl IntoResponse {
    let started = std::time::Instant::now();
    let super::Answer {
        code,
        review,
        result,
        policy_known,
    } = super::answer(&body, &policy, &state.policies);
    // Only policies the webhook knows become label values: any client can call any path.
    let label = if policy_known { policy.as_str() } else { "unknown" };
    state.metrics.observe_review(label, result, started.elapsed());
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
    (status, axum::Json(review))
}

/// Serves HTTPS on `address` until `shutdown` completes.
pub async fn serve(
    address: SocketAddr,
    certs: Arc<CertStore>,
    policies: Arc<dyn PolicySource>,
    metrics: Arc<WebhookMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver(certs)));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(address).await?;
    info!(address = %listener.local_addr()?, "serving the conversion webhook (HTTPS /convert/<policy>)");
    let app = router(policies, metrics);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(error = %error, "accept failed");
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(error) => {
                    debug!(%peer, error = %error, "TLS handshake failed");
                    return;
                }
            };
            let served = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
            if let Err(error) = served {
                debug!(%peer, error = %error, "connection ended with an error");
            }
        });
    }
}
