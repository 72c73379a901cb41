//! `crd-lifecycle webhook`: the conversion webhook on its own.

use std::net::SocketAddr;
use std::sync::Arc;

use super::{CachedPolicies, CertStore, PolicySource, StaticPolicies, certs};
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
}

/// Serves until Ctrl-C / SIGTERM. Errors are bad input or a failed start.
pub async fn run(args: &StandaloneSettings, client: Option<kube::Client>) -> Result<(), String> {
    let policies: Arc<dyn PolicySource> = if args.policy.is_empty() {
        let client = client.ok_or("no policy file given and no cluster to watch VersionPolicies in")?;
        let (cache, watches) = CachedPolicies::watch(client);
        tokio::spawn(watches);
        cache.wait_until_ready().await.map_err(|e| e.to_string())?;
        Arc::new(cache)
    } else {
        let mut loaded = Vec::new();
        for path in &args.policy {
            let text = manifest::read_source(path).map_err(|e| e.to_string())?;
            loaded
                .push(manifest::parse_policy(&text, &manifest::origin_of(path)).map_err(|e| e.to_string())?);
        }
        Arc::new(StaticPolicies(loaded))
    };
    let store = Arc::new(CertStore::default());
    match (&args.cert_file, &args.key_file) {
        (Some(cert), Some(key)) => {
            let read =
                |path: &str| std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"));
            store.set_pem(&read(cert)?, &read(key)?)?;
        }
        _ => {
            let bundle = certs::new_bundle(&args.name, jiff::Timestamp::now()).map_err(|e| e.to_string())?;
            store.set_pem(&bundle.cert_pem, &bundle.key_pem)?;
            if let Some(path) = &args.ca_out {
                std::fs::write(path, &bundle.ca_pem).map_err(|e| format!("cannot write {path}: {e}"))?;
                tracing::info!(path, "wrote the self-signed CA certificate (the CRD's caBundle)");
            }
        }
    }
    let address = SocketAddr::from(([0, 0, 0, 0], args.port));
    super::serve(address, store, policies, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| format!("the webhook stopped: {e}"))
}
