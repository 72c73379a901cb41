//! `crd-lifecycle adopt`.

use std::io::Write;

use crd_lifecycle::{kubeclient, migrate};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

use super::CommandError;
use crate::cli::AdoptArgs;

pub async fn run(args: AdoptArgs) -> Result<(), CommandError> {
    let client = kubeclient::client(&args.cluster)
        .await
        .map_err(CommandError::invalid)?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = api
        .get_opt(&args.crd)
        .await
        .map_err(CommandError::failed)?
        .ok_or_else(|| {
            CommandError::InvalidInput(format!("CustomResourceDefinition {} not found", args.crd))
        })?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| args.crd.split('.').next().unwrap_or(&args.crd).to_owned());
    let stored = crd
        .status
        .as_ref()
        .and_then(|s| s.stored_versions.as_deref())
        .unwrap_or_default();
    let storage = crd.spec.versions.iter().find(|v| v.storage).map(|v| &v.name);
    // Only for the note on a stale storedVersions: how many objects a migration would rewrite.
    let objects = match stored.iter().any(|v| Some(v) != storage) {
        true => migrate::count_objects(&client, &args.crd, &migrate::Settings::default())
            .await
            .ok()
            .flatten(),
        false => None,
    };
    let adopted = crd_lifecycle::adopt::adopt(&crd, &name, jiff::Timestamp::now(), objects);
    if let Some(note) = &adopted.note {
        eprintln!("note: {note}");
    }
    std::io::stdout()
        .write_all(adopted.policy.as_bytes())
        .map_err(CommandError::failed)
}
