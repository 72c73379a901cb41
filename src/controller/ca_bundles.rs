//! The leader keeps the `caBundle` of every CRD pointed at the webhook equal to the CAs the
//! replicas need, whatever governs the CRD. A policy's reconcile writes it with the rest of
//! `spec.conversion`, but a CRD whose policy reconciles nothing (suspended, in dry run, in
//! conflict, deleted and released with the webhook left in place) would keep the old CA:
//! no replica would ever serve the rotated certificate (each waits until every CRD pointed
//! at the webhook trusts its CA), and conversion of every CRD would fail once the old
//! certificate expires. Only `caBundle` is written, guarded by the resourceVersion read.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use super::conversion_config::WebhookEndpoint;

/// How often the CRDs are looked at when the bundle did not change (a CRD pointed at the
/// webhook since, or a write that lost a race).
const LOOK_AGAIN_EVERY: Duration = Duration::from_secs(60);

/// What one pass did.
#[derive(Debug, Default)]
pub struct Synced {
    /// The CRDs whose `caBundle` was written.
    pub written: Vec<String>,
    /// The CRDs that could not be written, and why (each is tried again at the next pass;
    /// one never keeps the others from their bundle).
    pub failed: Vec<(String, String)>,
}

/// Writes the bundle to every CRD pointed at the webhook whose `caBundle` differs. A CRD
/// that changed since it was listed (the patch's `test` op fails) or was deleted is left
/// for the next pass; `Err` only when the CRDs cannot be listed.
pub async fn sync_ca_bundles(client: &Client, endpoint: &WebhookEndpoint) -> Result<Synced, kube::Error> {
    let Some(bundle) = endpoint
        .ca_bundle
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
    else {
        return Ok(Synced::default());
    };
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut synced = Synced::default();
    for crd in crds.list(&ListParams::default()).await?.items {
        let Some(config) = crd
            .spec
            .conversion
            .as_ref()
            .and_then(|c| c.webhook.as_ref())
            .and_then(|w| w.client_config.as_ref())
            .filter(|config| endpoint.is_ours(config))
        else {
            continue;
        };
        if config
            .ca_bundle
            .as_ref()
            .is_some_and(|b| b.0 == bundle.as_bytes())
        {
            continue;
        }
        let name = crd.metadata.name.clone().unwrap_or_default();
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": crd.metadata.resource_version},
            {"op": "replace", "path": "/spec/conversion/webhook/clientConfig/caBundle",
             "value": ByteString(bundle.clone().into_bytes())},
        ]))
        .map_err(kube::Error::SerdeError)?;
        match crds
            .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => synced.written.push(name),
            // Changed since the list (the test op failed: 422 with the generic message of a
            // patch that does not apply, apiserver-samples/03), or deleted: the next pass.
            Err(kube::Error::Api(status)) if status.code == 404 || test_failed(&status) => {}
            // Anything else (an admission policy refusing it, a 5xx) is said, CRD by CRD.
            Err(error) => synced.failed.push((name, error.to_string())),
        }
    }
    Ok(synced)
}

/// Whether a JSON Patch was refused because a `test` op failed (the CRD changed since it was
/// read), not by validation or admission, which name the object in their message.
fn test_failed(status: &kube::core::Status) -> bool {
    status.code == 422
        && (status.message.contains("testing value")
            || status
                .message
                .starts_with("the server rejected our request due to an error in our request"))
}

/// Runs `sync_ca_bundles` whenever the bundle changes, and every minute.
pub async fn keep_ca_bundles(client: Client, endpoint: Arc<WebhookEndpoint>) {
    let mut changes = endpoint.bundle_changes();
    loop {
        match sync_ca_bundles(&client, &endpoint).await {
            Ok(synced) => {
                if !synced.written.is_empty() {
                    info!(
                        crds = synced.written.join(", "),
                        "wrote the webhook's CA bundle to the CRDs pointed at it"
                    );
                }
                for (crd, error) in &synced.failed {
                    warn!(
                        crd,
                        error, "cannot write the webhook's CA bundle to the CRD; retrying"
                    );
                }
            }
            Err(error) => {
                warn!(error = %error, "cannot list the CRDs to write the webhook's CA bundle; retrying")
            }
        }
        tokio::select! {
            biased;
            _ = changes.changed() => {}
            () = tokio::time::sleep(LOOK_AGAIN_EVERY) => {}
        }
    }
}
