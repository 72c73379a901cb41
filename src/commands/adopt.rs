//! `crd-lifecycle adopt`.

use std::io::Write;

use crd_lifecycle::kubeclient;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

use super::CommandError;
use crate::cli::AdoptArgs;

pub async fn run(args: AdoptArgs) -> Result<(), CommandError> {
    let client = kubeclient::client(&args.cluster)
        .await
        .map_err(CommandError::invalid)?;
    let api: Api<CustomResourceDefinition> = Api::all(client);
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
    let text = crd_lifecycle::adopt::adopt(&crd, &name, jiff::Timestamp::now());
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(CommandError::failed)
}
