//! What a migration reads: pages of a metadata-only list, how many objects there are,
//! discovery of a resource, whether the CRD exists, one object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::api::ListParams;
use kube::core::{DynamicObject, ObjectList, PartialObjectMeta};
use serde_json::Value;

use super::Requester;
use super::answer::Answer;
use crate::migrate::target::Target;

/// One object to process, as listed (metadata only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectKey {
    pub namespace: Option<String>,
    pub name: String,
    pub resource_version: String,
    /// Its `metadata.managedFields` (JSON), when a managedFields cleanup asked for them.
    pub managed_fields: Vec<Value>,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// One page of a metadata-only list.
#[derive(Debug)]
pub struct Page {
    pub objects: Vec<ObjectKey>,
    pub next: Option<String>,
    pub remaining: Option<u64>,
}

/// What discovery (`GET /apis/<group>/<version>`) says of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovered {
    /// The group version is served but does not list the resource, or is not served at all.
    Absent,
    /// The resource is served; its `storageVersionHash`, if the apiserver gives one
    /// (samples 25, 26).
    Served { storage_version_hash: Option<String> },
}

impl Requester<'_> {
    /// Lists one page of objects (metadata only: `PartialObjectMetadataList`, samples 09-10).
    pub async fn list_page(
        &self,
        target: &Target,
        page_size: u32,
        token: Option<&str>,
        with_managed_fields: bool,
    ) -> Result<Page, Answer> {
        self.list_page_at(&target.list_path(), page_size, token, with_managed_fields)
            .await
    }

    /// Lists one page of the collection at `path` (metadata only).
    pub(in crate::migrate) async fn list_page_at(
        &self,
        path: &str,
        page_size: u32,
        token: Option<&str>,
        with_managed_fields: bool,
    ) -> Result<Page, Answer> {
        let mut params = ListParams::default().limit(page_size);
        if let Some(token) = token {
            params = params.continue_token(token);
        }
        let request = kube::core::Request::new(path)
            .list_metadata(&params)
            .map_err(|e| Answer::Transport(e.to_string()))?;
        let bytes = self.send(request).await?;
        let list: ObjectList<PartialObjectMeta<DynamicObject>> = serde_json::from_slice(&bytes)
            .map_err(|e| Answer::Transport(format!("cannot decode the list: {e}")))?;
        let objects = list
            .items
            .into_iter()
            .map(|item| ObjectKey {
                managed_fields: match (with_managed_fields, &item.metadata.managed_fields) {
                    (true, Some(entries)) => entries
                        .iter()
                        .filter_map(|e| serde_json::to_value(e).ok())
                        .collect(),
                    _ => Vec::new(),
                },
                namespace: item.metadata.namespace,
                name: item.metadata.name.unwrap_or_default(),
                resource_version: item.metadata.resource_version.unwrap_or_default(),
            })
            .collect();
        Ok(Page {
            objects,
            next: list.metadata.continue_.filter(|t| !t.is_empty()),
            remaining: list
                .metadata
                .remaining_item_count
                .and_then(|n| u64::try_from(n).ok()),
        })
    }

    /// How many objects there are: a list of full objects with `limit=1` carries
    /// `remainingItemCount`, which limited metadata-only lists do not (sample 30).
    /// `None` when the apiserver gives no count.
    pub async fn count(&self, target: &Target) -> Result<Option<u64>, Answer> {
        let request = kube::core::Request::new(target.list_path())
            .list(&ListParams::default().limit(1))
            .map_err(|e| Answer::Transport(e.to_string()))?;
        let bytes = self.send(request).await?;
        let list: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Answer::Transport(format!("cannot decode the list: {e}")))?;
        let items = list["items"].as_array().map_or(0, Vec::len) as u64;
        let more = list["metadata"]["continue"]
            .as_str()
            .is_some_and(|t| !t.is_empty());
        Ok(match list["metadata"]["remainingItemCount"].as_u64() {
            Some(remaining) => Some(items + remaining),
            None if !more => Some(items),
            None => None,
        })
    }

    /// Whether the CRD still exists (a GET: 404 is `false`).
    pub async fn crd_exists(&self, name: &str) -> Result<bool, Answer> {
        let request = http::Request::get(format!(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        ))
        .body(Vec::new())
        .map_err(|e| Answer::Transport(e.to_string()))?;
        match self.send(request).await {
            Ok(_) => Ok(true),
            Err(Answer::Status { code: 404, .. }) => Ok(false),
            Err(answer) => Err(answer),
        }
    }

    /// What discovery of `group/version` says of `plural`.
    pub async fn discover(&self, group: &str, version: &str, plural: &str) -> Result<Discovered, Answer> {
        let request = http::Request::get(format!("/apis/{group}/{version}"))
            .body(Vec::new())
            .map_err(|e| Answer::Transport(e.to_string()))?;
        let bytes = match self.send(request).await {
            Ok(bytes) => bytes,
            // A group version nobody serves yet.
            Err(Answer::Status { code: 404, .. }) => return Ok(Discovered::Absent),
            Err(answer) => return Err(answer),
        };
        let list: APIResourceList = serde_json::from_slice(&bytes)
            .map_err(|e| Answer::Transport(format!("cannot decode discovery: {e}")))?;
        Ok(list
            .resources
            .into_iter()
            .find(|r| r.name == plural)
            .map_or(Discovered::Absent, |r| Discovered::Served {
                storage_version_hash: r.storage_version_hash.filter(|h| !h.is_empty()),
            }))
    }

    /// The whole object, read through the target's version.
    pub async fn object(&self, target: &Target, object: &ObjectKey) -> Result<Value, Answer> {
        let request = kube::core::Request::new(target.collection_path(object.namespace.as_deref()))
            .get(&object.name, &Default::default())
            .map_err(|e| Answer::Transport(e.to_string()))?;
        serde_json::from_slice(&self.send(request).await?)
            .map_err(|e| Answer::Transport(format!("cannot decode {object}: {e}")))
    }

    /// The object's resourceVersion and managedFields, read again.
    pub async fn managed_fields(
        &self,
        target: &Target,
        object: &ObjectKey,
    ) -> Result<(String, Vec<Value>), Answer> {
        let body = self.object(target, object).await?;
        let resource_version = body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let entries = body["metadata"]["managedFields"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok((resource_version, entries))
    }

    /// Reads one object through the storage version, which runs its conversion (a
    /// conversion preflight); writes nothing.
    pub async fn read(&self, target: &Target, object: &ObjectKey) -> Answer {
        let request = kube::core::Request::new(target.collection_path(object.namespace.as_deref()))
            .get(&object.name, &Default::default());
        self.answer(request).await
    }
}
