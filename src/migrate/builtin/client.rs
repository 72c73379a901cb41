//! The StorageVersionMigration API at the newest version of it that the apiserver serves
//! and this operator speaks: list, create, mark, delete, get.

use jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

use super::object::{CreatedFor, Migration};
use super::{GROUP, POLICY_LABEL, RESTORED_ANNOTATION, STORAGE_VERSION_LABEL};
use crate::migrate::apiserver_clock;

/// Versions of the API this operator speaks, newest first (v1 has the v1beta1 shape).
const KNOWN_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// Migrations as listed, and the apiserver's clock when they were.
#[derive(Clone, Debug)]
pub struct Listed {
    /// Oldest first.
    pub migrations: Vec<Migration>,
    /// The list answer's `date`.
    pub at: Option<Timestamp>,
}

/// The API, at one served version.
#[derive(Clone)]
pub struct Migrations {
    client: Client,
    api: Api<DynamicObject>,
    /// e.g. `v1beta1`.
    pub version: String,
}

impl Migrations {
    /// The newest served version of the API that this operator speaks, or `None` when the
    /// apiserver does not serve it.
    pub async fn discover(client: &Client) -> Result<Option<Migrations>, kube::Error> {
        let request = http::Request::get(format!("/apis/{GROUP}"))
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        let group: Value = match client.request(request).await {
            Ok(group) => group,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
            Err(error) => return Err(error),
        };
        let served: Vec<&str> = group["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["version"].as_str())
            .collect();
        let Some(version) = KNOWN_VERSIONS.into_iter().find(|v| served.contains(v)) else {
            return Ok(None);
        };
        let resource = ApiResource {
            group: GROUP.to_owned(),
            version: version.to_owned(),
            api_version: format!("{GROUP}/{version}"),
            kind: "StorageVersionMigration".to_owned(),
            plural: "storageversionmigrations".to_owned(),
        };
        Ok(Some(Migrations {
            client: client.clone(),
            api: Api::all_with(client.clone(), &resource),
            version: version.to_owned(),
        }))
    }

    fn path(&self) -> String {
        format!("/apis/{GROUP}/{}/storageversionmigrations", self.version)
    }

    /// Every migration of `group`/`resource`, oldest first, and the apiserver's clock.
    pub async fn of_resource(&self, group: &str, resource: &str) -> Result<Listed, kube::Error> {
        let listed = apiserver_clock::get::<Value>(&self.client, &self.path())
            .await?
            .ok_or_else(|| not_found(&self.path()))?;
        let mut found: Vec<Migration> = listed.value["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(Migration::from_json)
            .filter(|m| m.group == group && m.resource == resource)
            .collect();
        found.sort_by_key(|m| (m.created, m.name.clone()));
        Ok(Listed {
            migrations: found,
            at: listed.date,
        })
    }

    /// Creates a migration of `group`/`resource`, labelled with the policy and storage
    /// version, annotated with the state of the CRD it is created for.
    pub async fn create(
        &self,
        name: &str,
        group: &str,
        resource: &str,
        policy: &str,
        storage_version: &str,
        created_for: &CreatedFor,
    ) -> Result<Migration, kube::Error> {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/{}", self.version),
            "kind": "StorageVersionMigration",
            "metadata": {"name": name, "labels": {POLICY_LABEL: policy, STORAGE_VERSION_LABEL: storage_version},
                         "annotations": created_for.annotations()},
            "spec": {"resource": {"group": group, "resource": resource}},
        }))
        .map_err(kube::Error::SerdeError)?;
        let created = self.api.create(&PostParams::default(), &object).await?;
        Ok(Migration::from_json(
            &serde_json::to_value(created).map_err(kube::Error::SerdeError)?,
        ))
    }

    /// Marks a failed migration whose `storedVersions` were restored (`RESTORED_ANNOTATION`).
    pub async fn mark_restored(&self, name: &str) -> Result<(), kube::Error> {
        let patch = json!({"metadata": {"annotations": {RESTORED_ANNOTATION: "true"}}});
        self.api
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
    }

    /// Deletes `migration` only if it is as read: `Ok(false)` when it changed since (409
    /// Conflict on the resourceVersion precondition, e.g. Kubernetes started it meanwhile:
    /// tests/fixtures/apiserver/svm-delete-precondition-v1.36.txt), `Ok(true)` when deleted
    /// or gone. A deleted migration the kube-controller-manager had not started never runs;
    /// a Running one deleted goes on rewriting unseen
    /// (tests/fixtures/apiserver/svm-delete-v1.36.txt), so one that may have started is kept.
    pub async fn delete_as_read(&self, migration: &Migration) -> Result<bool, kube::Error> {
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: migration.resource_version.clone(),
                uid: migration.uid.clone(),
            }),
            ..kube::api::DeleteParams::default()
        };
        match self.api.delete(&migration.name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// One migration, and the apiserver's clock when it was read.
    pub async fn get(&self, name: &str) -> Result<(Migration, Option<Timestamp>), kube::Error> {
        let path = format!("{}/{name}", self.path());
        match apiserver_clock::get::<Value>(&self.client, &path).await? {
            Some(read) => Ok((Migration::from_json(&read.value), read.date)),
            None => Err(not_found(&path)),
        }
    }
}

fn not_found(path: &str) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(&format!("{path} not found"), "NotFound")
            .with_code(404)
            .boxed(),
    )
}

/// The name of a policy's `attempt`th migration into `storage_version`: deterministic, so
/// that a restarted controller finds it, and a DNS subdomain of at most 253 characters.
pub fn migration_name(crd: &str, storage_version: &str, attempt: u32) -> String {
    let suffix = format!("-{storage_version}-{attempt}");
    let head: String = format!("crd-lifecycle.{crd}")
        .chars()
        .take(253 - suffix.len())
        .collect();
    format!("{}{suffix}", head.trim_end_matches(['.', '-']))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_deterministic_dns_subdomains() {
        assert_eq!(
            migration_name("widgets.example.com", "v1", 1),
            "crd-lifecycle.widgets.example.com-v1-1"
        );
        let long = format!("{}.example.com", "a".repeat(260));
        let name = migration_name(&long, "v1", 12);
        assert!(name.len() <= 253 && name.ends_with("-v1-12"), "{name}");
    }
}
