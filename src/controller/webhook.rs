//! Keeping a CRD's `spec.conversion` pointed at the operator's conversion webhook.

use std::sync::RwLock;

use k8s_openapi::ByteString;
use serde_json::{Value, json};

/// How the apiserver reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookTarget {
    /// A Service in the cluster (the usual in-cluster deployment).
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
    /// A URL (`https://host:port`), e.g. a controller run outside the cluster.
    Url(String),
}

impl WebhookTarget {
    /// Parses `NAMESPACE/NAME[:PORT]` (port 443 by default).
    pub fn parse_service(text: &str) -> Result<WebhookTarget, String> {
        let (namespace, rest) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not NAMESPACE/NAME[:PORT]"))?;
        let (name, port) = match rest.split_once(':') {
            Some((name, port)) => (name, port.parse().map_err(|_| format!("{port:?} is not a port"))?),
            None => (rest, 443),
        };
        if namespace.is_empty() || name.is_empty() {
            return Err(format!("{text:?} is not NAMESPACE/NAME[:PORT]"));
        }
        Ok(WebhookTarget::Service {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
        })
    }

    /// The names the serving certificate must carry.
    pub fn certificate_names(&self) -> Vec<String> {
        match self {
            WebhookTarget::Service { namespace, name, .. } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
                format!("{name}.{namespace}"),
                name.clone(),
            ],
            WebhookTarget::Url(url) => {
                let host = url
                    .split_once("://")
                    .map_or(url.as_str(), |(_, rest)| rest)
                    .split(['/', ':'])
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                vec![host]
            }
        }
    }
}

/// The webhook endpoint and the CA bundle the CRDs must trust.
pub struct WebhookEndpoint {
    pub target: WebhookTarget,
    /// The CA certificate (PEM), once known.
    pub ca_bundle: RwLock<Option<String>>,
}

impl WebhookEndpoint {
    pub fn new(target: WebhookTarget) -> Self {
        Self {
            target,
            ca_bundle: RwLock::new(None),
        }
    }

    pub fn set_ca_bundle(&self, pem: String) {
        *self.ca_bundle.write().unwrap_or_else(|p| p.into_inner()) = Some(pem);
    }

    /// The CRD's `spec.conversion` for a policy, once the CA bundle is known.
    pub fn desired_conversion(&self, policy: &str) -> Option<Value> {
        let ca = self.ca_bundle.read().unwrap_or_else(|p| p.into_inner()).clone()?;
        let ca_bundle = serde_json::to_value(ByteString(ca.into_bytes())).ok()?;
        let path = format!("/convert/{policy}");
        let client_config = match &self.target {
            WebhookTarget::Service {
                namespace,
                name,
                port,
            } => json!({
                "caBundle": ca_bundle,
                "service": {"namespace": namespace, "name": name, "path": path, "port": port},
            }),
            WebhookTarget::Url(base) => json!({
                "caBundle": ca_bundle,
                "url": format!("{}{path}", base.trim_end_matches('/')),
            }),
        };
        Some(json!({
            "strategy": "Webhook",
            "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": client_config},
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_service_references() {
        assert_eq!(
            WebhookTarget::parse_service("crd-lifecycle/crd-lifecycle-webhook"),
            Ok(WebhookTarget::Service {
                namespace: "crd-lifecycle".into(),
                name: "crd-lifecycle-webhook".into(),
                port: 443
            })
        );
        assert!(matches!(
            WebhookTarget::parse_service("ns/name:8443"),
            Ok(WebhookTarget::Service { port: 8443, .. })
        ));
        for bad in ["name", "/name", "ns/", "ns/name:x"] {
            assert!(WebhookTarget::parse_service(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn certificate_names_follow_the_target() {
        let url = WebhookTarget::Url("https://10.1.2.3:8443".into());
        assert_eq!(url.certificate_names(), ["10.1.2.3"]);
        let service = WebhookTarget::parse_service("ops/hook").expect("service");
        assert_eq!(service.certificate_names()[0], "hook.ops.svc");
    }

    #[test]
    fn the_desired_conversion_points_at_the_policy_path() {
        let endpoint = WebhookEndpoint::new(WebhookTarget::Url("https://127.0.0.1:8443/".into()));
        assert_eq!(endpoint.desired_conversion("widgets"), None, "no CA yet");
        endpoint.set_ca_bundle("PEM".into());
        let desired = endpoint.desired_conversion("widgets").expect("desired");
        assert_eq!(desired["strategy"], "Webhook");
        assert_eq!(desired["webhook"]["conversionReviewVersions"], json!(["v1"]));
        assert_eq!(
            desired["webhook"]["clientConfig"]["url"],
            "https://127.0.0.1:8443/convert/widgets"
        );
        assert_eq!(desired["webhook"]["clientConfig"]["caBundle"], "UEVN");
    }
}
