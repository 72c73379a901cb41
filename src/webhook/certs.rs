//! Certificates of the conversion webhook: a long-lived self-signed CA (its certificate is
//! the CRDs' `caBundle`) and a serving certificate it signs, kept in a Secret so that every
//! replica serves the same one; the serving certificate is re-issued (same CA, so the
//! CRDs need no change) well before it expires. Or certificates the user supplies (e.g.
//! from cert-manager), read from files.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp, ToSpan};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose,
};

/// Serving certificates are valid this long...
const SERVING_DAYS: i64 = 365;
/// ...and re-issued when less than this is left.
const RENEW_BEFORE_DAYS: i64 = 30;
const CA_DAYS: i64 = 3650;

const NOT_AFTER_ANNOTATION: &str = "crdlifecycle.io/serving-cert-not-after";
const SANS_ANNOTATION: &str = "crdlifecycle.io/serving-cert-names";

/// The PEMs the webhook serves and the CA the CRDs trust.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    pub ca_pem: String,
    pub ca_key_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub names: Vec<String>,
    pub not_after: Timestamp,
}

/// Failures handling certificates.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot read or write Secret {namespace}/{name}: {source}")]
    Secret {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {0} kept changing while the certificate was being updated")]
    Contended(String),
    #[error("cannot read {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Year, month and day of an instant (UTC), as rcgen takes validity dates.
fn ymd(at: Timestamp) -> (i32, u8, u8) {
    let date = at.to_zoned(jiff::tz::TimeZone::UTC).date();
    (
        i32::from(date.year()),
        date.month().unsigned_abs(),
        date.day().unsigned_abs(),
    )
}

/// Sets a certificate's validity (whole days, UTC).
fn set_validity(params: &mut CertificateParams, from: Timestamp, to: Timestamp) {
    let (year, month, day) = ymd(from);
    params.not_before = rcgen::date_time_ymd(year, month, day);
    let (year, month, day) = ymd(to);
    params.not_after = rcgen::date_time_ymd(year, month, day);
}

/// The CA's parameters: fixed, so that an issuer can be rebuilt from the stored CA key.
fn ca_params(now: Timestamp) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "crd-lifecycle conversion webhook CA");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(
        &mut params,
        now - SignedDuration::from_hours(24),
        now + (CA_DAYS * 24).hours(),
    );
    params
}

/// A new CA and serving certificate for `names` (DNS names or IP addresses).
pub fn new_bundle(names: &[String], now: Timestamp) -> Result<Bundle, Error> {
    let ca_key = KeyPair::generate()?;
    let ca = ca_params(now).self_signed(&ca_key)?;
    let (cert_pem, key_pem, not_after) = issue(&ca_key, names, now)?;
    Ok(Bundle {
        ca_pem: ca.pem(),
        ca_key_pem: ca_key.serialize_pem(),
        cert_pem,
        key_pem,
        names: names.to_vec(),
        not_after,
    })
}

/// A serving certificate for `names`, signed by the CA whose key this is.
fn issue(ca_key: &KeyPair, names: &[String], now: Timestamp) -> Result<(String, String, Timestamp), Error> {
    let mut params = CertificateParams::new(names.to_vec())?;
    let mut name = DistinguishedName::new();
    name.push(
        DnType::CommonName,
        names.first().map_or("crd-lifecycle-webhook", String::as_str),
    );
    params.distinguished_name = name;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let not_after = now + (SERVING_DAYS * 24).hours();
    set_validity(&mut params, now - SignedDuration::from_hours(24), not_after);
    let key = KeyPair::generate()?;
    let issuer = Issuer::new(ca_params(now), ca_key);
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem(), not_after))
}

impl Bundle {
    /// Whether the serving certificate must be re-issued: other names, or expiring soon.
    pub fn needs_renewal(&self, names: &[String], now: Timestamp) -> bool {
        self.names != names || self.not_after - SignedDuration::from_hours(RENEW_BEFORE_DAYS * 24) <= now
    }

    /// The same CA, a new serving certificate.
    pub fn renewed(&self, names: &[String], now: Timestamp) -> Result<Bundle, Error> {
        let ca_key = KeyPair::from_pem(&self.ca_key_pem)?;
        let (cert_pem, key_pem, not_after) = issue(&ca_key, names, now)?;
        Ok(Bundle {
            cert_pem,
            key_pem,
            names: names.to_vec(),
            not_after,
            ..self.clone()
        })
    }

    fn from_secret(secret: &Secret) -> Option<Bundle> {
        let data = secret.data.as_ref()?;
        let text = |key: &str| data.get(key).and_then(|b| String::from_utf8(b.0.clone()).ok());
        let annotations = secret.metadata.annotations.clone().unwrap_or_default();
        Some(Bundle {
            ca_pem: text("ca.crt")?,
            ca_key_pem: text("ca.key")?,
            cert_pem: text("tls.crt")?,
            key_pem: text("tls.key")?,
            names: annotations
                .get(SANS_ANNOTATION)
                .map(|n| n.split(',').map(str::to_owned).collect())
                .unwrap_or_default(),
            not_after: annotations.get(NOT_AFTER_ANNOTATION)?.parse().ok()?,
        })
    }

    fn write_to(&self, secret: &mut Secret) {
        let data: BTreeMap<String, ByteString> = [
            ("ca.crt", &self.ca_pem),
            ("ca.key", &self.ca_key_pem),
            ("tls.crt", &self.cert_pem),
            ("tls.key", &self.key_pem),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.clone().into_bytes())))
        .collect();
        secret.data = Some(data);
        // A Secret's type is immutable (422 "field is immutable" on a change, and a PUT
        // without one means Opaque: tests/fixtures/apiserver/secret-answers-v1.36.txt): a
        // Secret that exists keeps its own. The rotation record creates it Opaque when it
        // writes first (after `kubectl delete secret`); the certificates fit either type.
        if secret.type_.is_none() {
            secret.type_ = Some("kubernetes.io/tls".to_owned());
        }
        let annotations = secret.metadata.annotations.get_or_insert_with(BTreeMap::new);
        annotations.insert(NOT_AFTER_ANNOTATION.to_owned(), self.not_after.to_string());
        annotations.insert(SANS_ANNOTATION.to_owned(), self.names.join(","));
    }
}

/// Reads the webhook's certificates from the Secret, creating it or renewing the serving
/// certificate when needed. Concurrent replicas are serialised by the Secret's
/// resourceVersion: a loser re-reads what the winner wrote.
pub async fn ensure_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    names: &[String],
) -> Result<Bundle, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret_error = |source| Error::Secret {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        source,
    };
    for _ in 0..5 {
        let now = Timestamp::now();
        let existing = api.get_opt(name).await.map_err(secret_error)?;
        let result = match existing {
            None => {
                let bundle = new_bundle(names, now)?;
                let mut secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(name.to_owned()),
                        namespace: Some(namespace.to_owned()),
                        labels: Some(
                            [("app.kubernetes.io/name".to_owned(), "crd-lifecycle".to_owned())].into(),
                        ),
                        ..ObjectMeta::default()
                    },
                    ..Secret::default()
                };
                bundle.write_to(&mut secret);
                api.create(&PostParams::default(), &secret).await.map(|_| bundle)
            }
            Some(mut secret) => match Bundle::from_secret(&secret) {
                Some(bundle) if !bundle.needs_renewal(names, now) => return Ok(bundle),
                Some(bundle) => {
                    let renewed = bundle.renewed(names, now)?;
                    renewed.write_to(&mut secret);
                    api.replace(name, &PostParams::default(), &secret)
                        .await
                        .map(|_| renewed)
                }
                None => {
                    let bundle = new_bundle(names, now)?;
                    bundle.write_to(&mut secret);
                    api.replace(name, &PostParams::default(), &secret)
                        .await
                        .map(|_| bundle)
                }
            },
        };
        match result {
            Ok(bundle) => return Ok(bundle),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(secret_error(error)),
        }
    }
    Err(Error::Contended(format!("{namespace}/{name}")))
}

/// Certificates supplied by the user: (serving certificate PEM, key PEM, CA PEM).
pub fn read_files(cert: &str, key: &str, ca: &str) -> Result<(String, String, String), Error> {
    let read = |path: &str| {
        std::fs::read_to_string(path).map_err(|source| Error::File {
            path: path.to_owned(),
            source,
        })
    };
    Ok((read(cert)?, read(key)?, read(ca)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_renew_with_the_same_ca() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().expect("instant");
        let names = vec![
            "crd-lifecycle-webhook.crd-lifecycle.svc".to_owned(),
            "127.0.0.1".to_owned(),
        ];
        let bundle = new_bundle(&names, now).expect("generated");
        assert!(bundle.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!bundle.needs_renewal(&names, now));
        assert!(
            bundle.needs_renewal(&names, now + (340 * 24).hours()),
            "within 30 days of expiry"
        );
        assert!(
            bundle.needs_renewal(&["other.svc".to_owned()], now),
            "other names"
        );
        let renewed = bundle.renewed(&names, now + (340 * 24).hours()).expect("renewed");
        assert_eq!(
            renewed.ca_pem, bundle.ca_pem,
            "the CA stays, so CRDs need no new caBundle"
        );
        assert_ne!(renewed.cert_pem, bundle.cert_pem);
        let mut secret = Secret::default();
        renewed.write_to(&mut secret);
        assert_eq!(Bundle::from_secret(&secret), Some(renewed));
    }
}
