//! `crd-lifecycle webhook`: the conversion webhook on its own.

use std::net::SocketAddr;
use std::sync::Arc;

use super::{CachedPolicies, CertStore, Connections, PolicySource, Readiness, Server, StaticPolicies, certs};
use crate::manifest;

/// What the standalone webhook serves, and how.
#[derive(Clone, Debug)]
pub struct StandaloneSettings {
    pub port: u16,
    /// Policy files; none: watch the cluster's VersionPolicies through `client`.
    pub policy: Vec<String>,
    /// Serving certificate and key (PEM files); none: a self-signed pair for `name`.
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    /// DNS names (or IPs) of the self-signed certificate.
    pub name: Vec<String>,
    /// Where to write the self-signed CA (the CRD's caBundle).
    pub ca_out: Option<String>,
    /// The CRD the policies convert: their conversions must cover its schemas.
    pub crd: Option<String>,
    /// What one review may cost.
    pub limits: super::Limits,
    /// How connections age, and the drain after SIGTERM.
    pub connections: Connections,
}

/// Why the standalone webhook cannot start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no policy file given and no cluster to watch VersionPolicies in")]
    NoPolicySource,
    #[error("the VersionPolicy cache stopped before it was filled")]
    CacheClosed,
    /// A policy file that cannot be read or parsed (bad input).
    #[error(transparent)]
    Policy(#[from] manifest::Error),
    /// A policy whose conversion does not validate (bad input).
    #[error("{origin}: invalid spec.conversion:\n{errors}")]
    InvalidConversion {
        origin: String,
        errors: crate::field_errors::FieldErrors,
    },
    /// A certificate file that cannot be read or used (bad input).
    #[error("{path}: {message}")]
    CertificateFile { path: String, message: String },
    #[error("cannot create the self-signed certificates: {0}")]
    Certificates(#[from] certs::Error),
    #[error("the serving certificate cannot be used: {0}")]
    Certificate(String),
    #[error("cannot write {path}: {source}")]
    WriteCa {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on port {port}: {source}")]
    Bind {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("the webhook stopped: {0}")]
    Serve(#[source] std::io::Error),
}

impl Error {
    /// Whether the input (files, arguments) is at fault, rather than the environment.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::Policy(_) | Error::InvalidConversion { .. } | Error::CertificateFile { .. }
        )
    }
}

/// Serves until SIGTERM / SIGINT, then drains (see [`Connections`]). Errors are bad input
/// or a failed start.
pub async fn run(args: &StandaloneSettings, client: Option<kube::Client>) -> Result<(), Error> {
    let policies = policy_source(args, client).await?;
    let store = serving_certificate(args)?;
    let address = SocketAddr::from(([0, 0, 0, 0], args.port));
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| Error::Bind {
            port: args.port,
            source,
        })?;
    // Policies and certificate are loaded: ready until the shutdown signal.
    let readiness = Arc::new(Readiness::ready());
    let server = Server {
        certs: store,
        policies,
        metrics: Arc::new(super::WebhookMetrics::default()),
        limits: args.limits.clone(),
        readiness: readiness.clone(),
        connections: args.connections,
    };
    let stop = super::drain_after(crate::signals::terminated(), readiness, args.connections.drain);
    server.serve(listener, stop).await.map_err(Error::Serve)
}

/// Where the webhook finds the policies: the cluster's (watched), or the files given.
async fn policy_source(
    args: &StandaloneSettings,
    client: Option<kube::Client>,
) -> Result<Arc<dyn PolicySource>, Error> {
    let policies: Arc<dyn PolicySource> = if args.policy.is_empty() {
        let client = client.ok_or(Error::NoPolicySource)?;
        let (cache, watches) = CachedPolicies::watch(client);
        tokio::spawn(watches);
        if !cache.wait_until_ready().await {
            return Err(Error::CacheClosed);
        }
        Arc::new(cache)
    } else {
        policy_files(args)?
    };
    Ok(policies)
}

/// The policies of the files given, each conversion compiled (and, with `--crd`, checked to
/// cover the CRD's versions' schemas) at start.
fn policy_files(args: &StandaloneSettings) -> Result<Arc<dyn PolicySource>, Error> {
    let mut loaded = Vec::new();
    for path in &args.policy {
        let text = manifest::read_source(path)?;
        let origin = manifest::origin_of(path);
        let policy = manifest::parse_policy(&text, &origin)?;
        // Refused at start, not at every review.
        if let Some(spec) = &policy.spec.conversion {
            let converter =
                crate::conversion::Converter::for_spec(spec).map_err(|errors| Error::InvalidConversion {
                    origin: origin.clone(),
                    errors,
                })?;
            if let Some(crd) = &args.crd {
                let crd = manifest::parse_documents(&manifest::read_source(crd)?, &manifest::origin_of(crd))?
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                let schemas = crate::schema::version_schemas(&crd);
                let uncovered = crate::conversion::coverage::check(spec, &converter, &schemas);
                if !uncovered.is_empty() {
                    return Err(Error::InvalidConversion {
                        origin,
                        errors: uncovered,
                    });
                }
            }
        }
        loaded.push(policy);
    }
    Ok(Arc::new(StaticPolicies::new(loaded)))
}

/// The serving certificate: the files given, or a self-signed one (its CA written to
/// `--ca-out`).
fn serving_certificate(args: &StandaloneSettings) -> Result<Arc<CertStore>, Error> {
    let store = Arc::new(CertStore::default());
    match (&args.cert_file, &args.key_file) {
        (Some(cert), Some(key)) => {
            let read = |path: &str| {
                std::fs::read_to_string(path).map_err(|e| Error::CertificateFile {
                    path: path.to_owned(),
                    message: e.to_string(),
                })
            };
            store
                .set_pem(&read(cert)?, &read(key)?)
                .map_err(|message| Error::CertificateFile {
                    path: cert.clone(),
                    message,
                })?;
        }
        _ => {
            let bundle = certs::new_bundle(&args.name, jiff::Timestamp::now())?;
            store
                .set_pem(&bundle.cert_pem, &bundle.key_pem)
                .map_err(Error::Certificate)?;
            if let Some(path) = &args.ca_out {
                std::fs::write(path, &bundle.ca_pem).map_err(|source| Error::WriteCa {
                    path: path.clone(),
                    source,
                })?;
                tracing::info!(path, "wrote the self-signed CA certificate (the CRD's caBundle)");
            }
        }
    }
    Ok(store)
}
