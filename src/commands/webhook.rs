//! `crd-lifecycle webhook`: the conversion webhook on its own.

use crd_lifecycle::kubeclient;
use crd_lifecycle::webhook::standalone::{self, StandaloneSettings};

use super::CommandError;
use crate::cli::StandaloneWebhookArgs;

pub async fn run(args: StandaloneWebhookArgs) -> Result<(), CommandError> {
    // Without policy files it watches the cluster's VersionPolicies.
    let client = if args.policy.is_empty() {
        Some(
            kubeclient::client(&args.cluster)
                .await
                .map_err(CommandError::failed)?,
        )
    } else {
        None
    };
    let settings = StandaloneSettings {
        port: args.port,
        policy: args.policy,
        cert_file: args.cert_file,
        key_file: args.key_file,
        name: args.name,
        ca_out: args.ca_out,
        crd: args.crd,
        limits: crd_lifecycle::webhook::Limits {
            max_review_bytes: args.max_review_bytes,
            ..Default::default()
        },
        connections: crd_lifecycle::webhook::Connections::new(
            args.drain,
            args.max_connection_age,
            args.idle_grace,
        ),
    };
    standalone::run(&settings, client).await.map_err(|error| {
        if error.is_invalid_input() {
            CommandError::invalid(error)
        } else {
            CommandError::failed(error)
        }
    })
}
