//! The serving certificate, replaceable at any time, and the resolver that hands TLS
//! handshakes the one installed now.

use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The serving certificate, replaceable at any time.
#[derive(Debug, Default)]
pub struct CertStore {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl CertStore {
    /// Installs a certificate chain and key (PEM).
    pub fn set_pem(&self, cert_pem: &str, key_pem: &str) -> Result<(), String> {
        let certified = certified_key(cert_pem, key_pem)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(certified);
        Ok(())
    }

    /// Whether a certificate chain and key (PEM) could be installed.
    pub fn check_pem(cert_pem: &str, key_pem: &str) -> Result<(), String> {
        certified_key(cert_pem, key_pem).map(|_| ())
    }

    /// Whether the certificate served is the first of this PEM chain.
    pub fn serves(&self, cert_pem: &str) -> bool {
        let Some(Ok(wanted)) = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).next() else {
            return false;
        };
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|current| current.cert.first() == Some(&wanted))
    }

    pub fn is_ready(&self) -> bool {
        self.current.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The certificate served (DER, the first of its chain), if any: what a TLS client of
    /// the webhook is shown.
    pub fn served(&self) -> Option<CertificateDer<'static>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|current| current.cert.first().cloned())
    }
}

fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("invalid certificate PEM: {e}"))?;
    if chain.is_empty() {
        return Err("no certificate in the PEM".to_owned());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("invalid key PEM: {e}"))?;
    let signing_key =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| format!("unsupported key: {e}"))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing_key)))
}

/// Hands each TLS handshake the certificate installed now.
#[derive(Debug)]
pub(super) struct Resolver(pub(super) Arc<CertStore>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
