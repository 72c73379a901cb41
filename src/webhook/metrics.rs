//! The conversion webhook's metrics: reviews answered (by policy and result), how long each
//! took, its connections, and when the serving certificate expires. Registered into the controller's registry
//! (`crd_lifecycle_` prefix); the standalone `webhook` command keeps them unregistered.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// How one ConversionReview was answered.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReviewResult {
    /// Every object converted.
    success,
    /// A Failed result (an object that cannot convert, or no conversion for the policy): the
    /// apiserver fails the read or write that needed it.
    failure,
    /// The body was not a ConversionReview (HTTP 400).
    invalid,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    pub policy: String,
    pub result: ReviewResult,
}

/// The conversion webhook's metrics.
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    /// `crd_lifecycle_conversion_reviews_total{policy, result}`.
    pub reviews: Family<ReviewLabels, Counter>,
    /// `crd_lifecycle_conversion_review_duration_seconds`.
    pub review_duration: Histogram,
    /// `crd_lifecycle_webhook_certificate_expiration_timestamp_seconds`: the serving
    /// certificate's notAfter (Unix time); absent until a certificate is loaded.
    pub certificate_expiration: Gauge<f64, AtomicU64>,
    /// `crd_lifecycle_webhook_open_connections`: client connections open now.
    pub open_connections: Gauge,
    /// `crd_lifecycle_webhook_connections_aged_out_total`: connections asked to close
    /// (HTTP/2 GOAWAY) because they reached their maximum age.
    pub connections_aged_out: Counter,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self {
            reviews: Family::default(),
            // 0.5 ms to about 4 s: a review of a few objects takes well under a millisecond,
            // the apiserver's timeout is at most 30 s.
            review_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            certificate_expiration: Gauge::default(),
            open_connections: Gauge::default(),
            connections_aged_out: Counter::default(),
        }
    }
}

impl WebhookMetrics {
    /// New metrics, registered into `registry`.
    pub fn registered(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "conversion_reviews",
            "ConversionReviews answered by the conversion webhook, by policy (unknown for a path naming no known policy) and result: success, failure (a Failed result) or invalid (not a review)",
            metrics.reviews.clone(),
        );
        registry.register_with_unit(
            "conversion_review_duration",
            "Time the conversion webhook takes to answer a ConversionReview",
            Unit::Seconds,
            metrics.review_duration.clone(),
        );
        registry.register(
            "webhook_certificate_expiration_timestamp_seconds",
            "When the conversion webhook's serving certificate expires (notAfter, Unix time)",
            metrics.certificate_expiration.clone(),
        );
        registry.register(
            "webhook_open_connections",
            "Client connections the conversion webhook has open (per replica: how the apiservers' connections spread)",
            metrics.open_connections.clone(),
        );
        registry.register(
            "webhook_connections_aged_out",
            "Connections the conversion webhook asked to close (HTTP/2 GOAWAY, HTTP/1.1 Connection: close) at their maximum age",
            metrics.connections_aged_out.clone(),
        );
        metrics
    }

    /// Counts one answered review.
    pub fn observe_review(&self, policy: &str, result: ReviewResult, elapsed: Duration) {
        self.reviews
            .get_or_create(&ReviewLabels {
                policy: policy.to_owned(),
                result,
            })
            .inc();
        self.review_duration.observe(elapsed.as_secs_f64());
    }

    /// Records the notAfter of the serving certificate (the first in the PEM chain).
    pub fn set_certificate(&self, cert_pem: &str) -> Result<(), String> {
        let not_after = not_after(cert_pem)?;
        self.certificate_expiration.set(not_after as f64);
        Ok(())
    }
}

/// The notAfter (Unix seconds) of the first certificate in a PEM chain.
pub fn not_after(cert_pem: &str) -> Result<i64, String> {
    let der = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .next()
        .ok_or("no certificate in the PEM")?
        .map_err(|e| format!("invalid certificate PEM: {e}"))?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| format!("invalid certificate: {e}"))?;
    Ok(cert.validity().not_after.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_not_after_of_a_generated_certificate() {
        let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().expect("instant");
        let bundle = super::super::certs::new_bundle(&["webhook.example".to_owned()], now).expect("bundle");
        let seconds = not_after(&bundle.cert_pem).expect("parses");
        // rcgen writes whole days (UTC midnight).
        assert_eq!(
            seconds,
            bundle.not_after.as_second() - bundle.not_after.as_second() % 86_400
        );
        assert!(not_after("not a certificate").is_err());
    }

    #[test]
    fn exports_under_the_documented_names() {
        let mut registry = Registry::with_prefix("crd_lifecycle");
        let metrics = WebhookMetrics::registered(&mut registry);
        metrics.observe_review("widgets", ReviewResult::success, Duration::from_millis(2));
        metrics.certificate_expiration.set(1.8e9);
        metrics.open_connections.inc();
        metrics.connections_aged_out.inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(
            text.contains(r#"crd_lifecycle_conversion_reviews_total{policy="widgets",result="success"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("crd_lifecycle_conversion_review_duration_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains("crd_lifecycle_webhook_certificate_expiration_timestamp_seconds 1800000000"),
            "{text}"
        );
        assert!(
            text.contains("crd_lifecycle_webhook_open_connections 1"),
            "{text}"
        );
        assert!(
            text.contains("crd_lifecycle_webhook_connections_aged_out_total 1"),
            "{text}"
        );
    }
}
