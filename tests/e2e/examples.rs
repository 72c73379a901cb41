//! The upgrade examples' manifests (`examples/upgrades/`), for the scenarios that run as
//! them.

use k8s_openapi::api::rbac::v1::ClusterRole;
use serde_json::{Value, json};

const UPGRADE_RBAC: &str = include_str!("../../examples/upgrades/base/rbac.yaml");

/// The upgrade hook's ClusterRole, named `name`, for a test CRD of `group` instead of
/// `example.com` (its rules otherwise as shipped).
pub fn upgrade_cluster_role(name: &str, group: &str) -> Result<ClusterRole, String> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(UPGRADE_RBAC).map_err(|e| e.to_string())?;
    let role = documents
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole")
        .ok_or("examples/upgrades/base/rbac.yaml has no ClusterRole")?;
    let text = role.to_string().replace("example.com", group);
    let mut role: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    role["metadata"]["name"] = json!(name);
    serde_json::from_value(role).map_err(|e| e.to_string())
}
