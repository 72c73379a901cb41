//! The baseline of the migrate benchmarks: a raw client making the migrator's requests
//! (metadata-only pages, one no-op merge patch per object carrying its resourceVersion) with
//! a pool of the same size and nothing else, as a plain client makes them: each patch is
//! answered with the whole object (the migrator asks for its metadata only).

use futures::StreamExt;
use kube::api::{ListParams, Patch, PatchParams};
use kube::client::Body;
use kube::core::{DynamicObject, ObjectList, PartialObjectMeta};
use serde_json::json;

/// What a pass did.
pub struct Rewritten {
    pub objects: u64,
    /// How long the first page took to arrive (before it, no rewrite could start).
    #[allow(dead_code, reason = "read by benches/real, not by benches/migrate")]
    pub first_page: std::time::Duration,
}

/// Rewrites every object listed at `list_path` (`/apis/<group>/<version>/<plural>`, all
/// namespaces), `page_size` per page, `concurrency` patches at once.
pub async fn rewrite_all(
    client: &kube::Client,
    list_path: &str,
    page_size: u32,
    concurrency: usize,
) -> Rewritten {
    let (prefix, plural) = list_path.rsplit_once('/').expect("a list path");
    let mut token: Option<String> = None;
    let mut done = 0;
    let started = std::time::Instant::now();
    let mut first_page = None;
    loop {
        let mut params = ListParams::default().limit(page_size);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let request = kube::core::Request::new(list_path)
            .list_metadata(&params)
            .expect("request");
        let list: ObjectList<PartialObjectMeta<DynamicObject>> = client.request(request).await.expect("list");
        first_page.get_or_insert_with(|| started.elapsed());
        token = list.metadata.continue_.clone().filter(|t| !t.is_empty());
        done += futures::stream::iter(list.items)
            .map(|item| async move {
                let name = item.metadata.name.unwrap_or_default();
                let path = match &item.metadata.namespace {
                    Some(ns) => format!("{prefix}/namespaces/{ns}/{plural}"),
                    None => list_path.to_owned(),
                };
                let patch = json!({"metadata": {"resourceVersion": item.metadata.resource_version}});
                let request = kube::core::Request::new(path)
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .expect("request");
                let response = client.send(request.map(Body::from)).await.expect("patch");
                let status = response.status();
                let body = response.into_body().collect_bytes().await;
                // 409: written since it was listed (so re-encoded already), as for the migrator.
                assert!(
                    status.is_success() || status.as_u16() == 409,
                    "raw patch of {name}: {status}: {body:?}"
                );
                1u64
            })
            .buffer_unordered(concurrency)
            .fold(0, |sum, n| async move { sum + n })
            .await;
        if token.is_none() {
            return Rewritten {
                objects: done,
                first_page: first_page.unwrap_or_default(),
            };
        }
    }
}
