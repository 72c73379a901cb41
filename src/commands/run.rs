//! `crd-lifecycle run`: the controller.

use crd_lifecycle::controller::leader::LeaseSettings;
use crd_lifecycle::controller::{self, RunSettings};
use crd_lifecycle::kubeclient;
use crd_lifecycle::webhook::WebhookSettings;
use crd_lifecycle::webhook::ca::{CertificateSource, RotationRecord, WebhookTarget};

use super::CommandError;
use crate::cli::RunArgs;

pub async fn run(args: RunArgs) -> Result<(), CommandError> {
    let client = kubeclient::client(&args.cluster)
        .await
        .map_err(CommandError::failed)?;
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let lease = args.leader_election.then(|| {
        LeaseSettings::new(
            args.lease_namespace.clone(),
            args.lease_name.clone(),
            identity.clone(),
        )
    });
    let settings = RunSettings {
        metrics_address: args.metrics_addr,
        lease,
        resync: args.resync,
        identity,
        parallel_migrations: usize::try_from(args.parallel_migrations).unwrap_or(2),
        traffic_sample_interval: args.traffic_sample_interval,
        svm_pending_deadline: args.svm_pending_deadline,
        webhook: webhook_settings(&args)?,
    };
    controller::run(client, settings)
        .await
        .map_err(CommandError::failed)
}

/// The conversion webhook `run` serves, from its flags.
fn webhook_settings(args: &RunArgs) -> Result<Option<WebhookSettings>, CommandError> {
    let flags = &args.webhook;
    let Some(port) = flags.webhook_port else {
        return Ok(None);
    };
    let target = match (&flags.webhook_service, &flags.webhook_url) {
        (Some(service), None) => WebhookTarget::parse_service(service)
            .map_err(|e| CommandError::InvalidInput(format!("--webhook-service: {e}")))?,
        (None, Some(url)) if url.starts_with("https://") => WebhookTarget::Url(url.clone()),
        (None, Some(url)) => {
            return Err(CommandError::InvalidInput(format!(
                "--webhook-url: {url:?} must start with https://"
            )));
        }
        _ => {
            return Err(CommandError::InvalidInput(
                "--webhook-port needs --webhook-service or --webhook-url (how the apiserver reaches it)"
                    .to_owned(),
            ));
        }
    };
    let certificates = match (
        &flags.webhook_cert_file,
        &flags.webhook_key_file,
        &flags.webhook_ca_file,
    ) {
        (Some(cert), Some(key), Some(ca)) => CertificateSource::Files {
            cert: cert.clone(),
            key: key.clone(),
            ca: ca.clone(),
        },
        _ => CertificateSource::Secret {
            namespace: args.lease_namespace.clone(),
            name: flags.webhook_secret.clone(),
        },
    };
    // Three times the interval each replica records what it serves at (a third of this).
    let record_ttl = match &certificates {
        CertificateSource::Files { .. } => std::time::Duration::from_secs(180),
        CertificateSource::Secret { .. } => std::time::Duration::from_secs(3 * 3600),
    };
    Ok(Some(WebhookSettings {
        address: std::net::SocketAddr::from(([0, 0, 0, 0], port)),
        target,
        certificates,
        limits: crd_lifecycle::webhook::Limits {
            max_review_bytes: args.webhook.webhook_max_review_bytes,
            ..Default::default()
        },
        record: Some(RotationRecord {
            namespace: args.lease_namespace.clone(),
            secret: flags.webhook_secret.clone(),
            replica: args.identity.clone().unwrap_or_else(default_identity),
            ttl: record_ttl,
        }),
        connections: crd_lifecycle::webhook::Connections::new(
            flags.webhook_drain,
            flags.webhook_max_connection_age,
            flags.webhook_idle_grace,
        ),
    }))
}

fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "crd-lifecycle".to_owned());
    format!("{host}-{}", std::process::id())
}
