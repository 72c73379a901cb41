//! The permissions a run needs on a CRD's resource, whether the caller has them (asked of
//! the apiserver with SelfSubjectAccessReviews before any object is touched), and the
//! ClusterRole that grants them.
//!
//! The operator's migrator ClusterRole aggregates every ClusterRole labelled
//! `crdlifecycle.io/aggregate-to-migrator: "true"`: each team adds one for the CRDs its
//! policies govern, and nothing grants access to any other resource.

use std::fmt;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use super::crd_reads::kube_request;
use super::{Error, Mode, Settings};

/// The label that aggregates a ClusterRole into the operator's migrator role.
pub const AGGREGATE_LABEL: &str = "crdlifecycle.io/aggregate-to-migrator";

/// One verb on one resource (or subresource) of an API group, on every object or on one
/// by name (which a ClusterRole's `resourceNames` can grant).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permission {
    pub verb: &'static str,
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub name: Option<String>,
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(subresource) = &self.subresource {
            write!(f, "/{subresource}")?;
        }
        if let Some(name) = &self.name {
            write!(f, " named {name}")?;
        }
        write!(f, " in API group {}", self.group)
    }
}

/// The resource and group of a CRD from its name, which the apiserver requires to be
/// `<plural>.<group>`.
pub fn resource_of(crd: &str) -> (&str, &str) {
    crd.split_once('.').unwrap_or((crd, ""))
}

/// The API group of CustomResourceDefinitions.
const CRD_GROUP: &str = "apiextensions.k8s.io";

/// What a run of `mode` over the CRD's objects needs: listing them, and reading
/// (preflight, managedFields cleanup) or patching them (rewrite through the resource or,
/// with `through_status`, its status subresource; cleanup of managedFields through the
/// resource). A dry run writes nothing. A rewrite also watches its CRD until the trim
/// (`migrate::StorageGuard`), and lists it by name after a gap in that watch.
pub fn required(crd: &str, mode: Mode, through_status: bool, dry_run: bool) -> Vec<Permission> {
    let (resource, group) = resource_of(crd);
    let on = |verb: &'static str, subresource: Option<&str>| Permission {
        verb,
        group: group.to_owned(),
        resource: resource.to_owned(),
        subresource: subresource.map(str::to_owned),
        name: None,
    };
    let mut needed = vec![on("list", None)];
    match mode {
        Mode::Preflight => needed.push(on("get", None)),
        Mode::Rewrite if through_status => needed.push(on("patch", Some("status"))),
        Mode::Rewrite => needed.push(on("patch", None)),
        Mode::CleanManagedFields => {
            needed.push(on("get", None));
            if !dry_run {
                needed.push(on("patch", None));
            }
        }
    }
    if mode == Mode::Rewrite {
        // The storage guard watches this one CRD (a field selector on its name, which
        // `resourceNames` can grant), and lists it by name after a gap in the watch.
        for verb in ["watch", "list"] {
            needed.push(Permission {
                verb,
                group: CRD_GROUP.to_owned(),
                resource: "customresourcedefinitions".to_owned(),
                subresource: None,
                name: Some(crd.to_owned()),
            });
        }
    }
    needed
}

/// The ClusterRole granting everything the operator's runs need on a CRD's resource,
/// labelled to be aggregated into the migrator role.
pub fn cluster_role(crd: &str, through_status: bool) -> Value {
    let (resource, group) = resource_of(crd);
    let mut rules = vec![json!({
        "apiGroups": [group],
        "resources": [resource],
        "verbs": ["get", "list", "patch"],
    })];
    if through_status {
        rules.push(json!({
            "apiGroups": [group],
            "resources": [format!("{resource}/status")],
            "verbs": ["patch"],
        }));
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": format!("crd-lifecycle-migrator-{crd}"),
            "labels": {AGGREGATE_LABEL: "true"},
        },
        "rules": rules,
    })
}

/// Says what is missing and how to grant it, in one line: on the CRD's objects, the
/// ClusterRole to apply, as JSON that `kubectl apply -f -` takes; on CustomResourceDefinitions
/// (not in that role: the operator's own role in deploy/rbac.yaml grants them), the verb.
pub fn missing_message(crd: &str, missing: &[Permission], through_status: bool) -> String {
    let (on_crds, on_objects): (Vec<&Permission>, Vec<&Permission>) =
        missing.iter().partition(|p| p.group == CRD_GROUP);
    let list = |permissions: &[&Permission]| {
        permissions
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = Vec::new();
    if !on_objects.is_empty() {
        parts.push(format!(
            "missing permission on the objects of {crd}: {}. Grant it with a ClusterRole labelled {AGGREGATE_LABEL}=true \
             (`crd-lifecycle rbac {crd}` prints it): {}",
            list(&on_objects),
            cluster_role(crd, through_status)
        ));
    }
    if !on_crds.is_empty() {
        parts.push(format!(
            "missing permission on CustomResourceDefinitions: {} (a migration watches {crd} until it trims \
             status.storedVersions, and lists it by name after a gap in that watch; a ClusterRole rule may \
             restrict both to it with resourceNames; deploy/rbac.yaml grants the operator get, list, watch and \
             patch on them)",
            list(&on_crds)
        ));
    }
    parts.join("; ")
}

/// The permissions in `needed` that the caller does not have, asked one by one with a
/// SelfSubjectAccessReview (allowed to every authenticated user by `system:basic-user`).
pub async fn missing(client: &Client, needed: &[Permission]) -> Result<Vec<Permission>, kube::Error> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    for permission in needed {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(permission.verb.to_owned()),
                    group: Some(permission.group.clone()),
                    resource: Some(permission.resource.clone()),
                    subresource: permission.subresource.clone(),
                    name: permission.name.clone(),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let answered = api.create(&PostParams::default(), &review).await?;
        if !answered.status.is_some_and(|status| status.allowed) {
            missing.push(permission.clone());
        }
    }
    Ok(missing)
}

/// Fails with `Error::MissingPermission`, naming every missing verb and the ClusterRole
/// that grants them, unless the caller may do everything the run needs.
pub(super) async fn check_permissions(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
) -> Result<(), Error> {
    let needed = required(
        crd_name,
        settings.mode,
        settings.through_status,
        settings.managed_fields.dry_run,
    );
    let missing = kube_request(settings, "checking permissions", || {
        self::missing(client, &needed)
    })
    .await?;
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::MissingPermission(missing_message(
        crd_name,
        &missing,
        settings.through_status,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_needs_its_verbs() {
        let verbs = |mode, status, dry_run| -> Vec<String> {
            required("widgets.example.com", mode, status, dry_run)
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert_eq!(
            verbs(Mode::Rewrite, false, false),
            [
                "list widgets in API group example.com",
                "patch widgets in API group example.com",
                "watch customresourcedefinitions named widgets.example.com in API group apiextensions.k8s.io",
                "list customresourcedefinitions named widgets.example.com in API group apiextensions.k8s.io"
            ]
        );
        assert_eq!(
            verbs(Mode::Rewrite, true, false)[1],
            "patch widgets/status in API group example.com"
        );
        assert_eq!(
            verbs(Mode::Preflight, false, false)[1],
            "get widgets in API group example.com"
        );
        assert_eq!(verbs(Mode::CleanManagedFields, false, false).len(), 3);
        assert_eq!(verbs(Mode::CleanManagedFields, false, true).len(), 2);
        assert!(
            verbs(Mode::Preflight, false, false)
                .iter()
                .all(|verb| !verb.contains("customresourcedefinitions")),
            "only a rewrite watches its CRD"
        );
    }

    #[test]
    fn a_missing_crd_watch_is_named_apart_from_the_objects_role() {
        let needed = required("widgets.example.com", Mode::Rewrite, false, false);
        let message = missing_message("widgets.example.com", &needed[2..], false);
        assert!(
            message.starts_with(
                "missing permission on CustomResourceDefinitions: watch customresourcedefinitions named widgets.example.com in API group apiextensions.k8s.io, list customresourcedefinitions named widgets.example.com"
            ) && !message.contains("ClusterRole labelled"),
            "{message}"
        );
    }

    #[test]
    fn the_cluster_role_is_labelled_for_aggregation_and_has_no_wildcard() {
        let role = cluster_role("widgets.example.com", true);
        assert_eq!(role["metadata"]["labels"][AGGREGATE_LABEL], "true");
        assert_eq!(role["rules"][0]["apiGroups"], json!(["example.com"]));
        assert_eq!(role["rules"][0]["resources"], json!(["widgets"]));
        assert_eq!(role["rules"][1]["resources"], json!(["widgets/status"]));
        assert!(!role.to_string().contains('*'));
    }
}
