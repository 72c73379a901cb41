//! `crd-lifecycle rbac`: the ClusterRole a governed CRD needs, for `kubectl apply -f -`.

use std::io::Write;

use crd_lifecycle::api::RewriteSubresource;
use crd_lifecycle::manifest;
use crd_lifecycle::migrate::permissions;

use super::CommandError;
use crate::cli::RbacArgs;

pub fn run(args: &RbacArgs) -> Result<(), CommandError> {
    let (crd, through_status) = match (&args.crd, &args.policy) {
        (_, Some(path)) => {
            let text = manifest::read_source(path).map_err(CommandError::invalid)?;
            let policy =
                manifest::parse_policy(&text, &manifest::origin_of(path)).map_err(CommandError::invalid)?;
            let through_status = policy.spec.migration.subresource == Some(RewriteSubresource::Status);
            (policy.spec.crd_name, through_status)
        }
        (Some(crd), None) => (crd.clone(), args.status_subresource),
        (None, None) => return Err(CommandError::invalid("name a CRD or give --policy")),
    };
    let (resource, group) = permissions::resource_of(&crd);
    if resource.is_empty() || group.is_empty() {
        return Err(CommandError::invalid(format!(
            "{crd:?} is not a CRD name: it is <plural>.<group>, e.g. widgets.example.com"
        )));
    }
    let role = permissions::cluster_role(&crd, through_status);
    let yaml = serde_saphyr::to_string(&role).map_err(CommandError::failed)?;
    std::io::stdout()
        .write_all(yaml.as_bytes())
        .map_err(CommandError::failed)
}
