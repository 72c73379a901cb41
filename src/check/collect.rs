//! What `check` reads of a cluster for one incoming CRD (I/O): the live CRD, the
//! VersionPolicy governing it, its objects' managedFields (paged metadata-only lists, only
//! where a version stops being served or disappears), their count (only where objects must
//! be rewritten), the objects themselves (paged full lists, only where the incoming schema of
//! the version read differs from the live one), and the apiserver's answer to a dry run of the
//! update (only where a stored version is missing, and where the caller may update CRDs).

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::client::Body;
use serde_json::Value;

use super::findings::{Cause, Governing, ObjectProblem, Observed, Validated, schema_json};
use crate::api::{MigrationPhase, VersionPolicy};
use crate::lifecycle::apiserver_rules;
use crate::migrate;
use crate::schema::{self, Schema};

/// How the objects are read.
#[derive(Clone, Debug)]
pub struct ReadSettings {
    /// Objects per list page.
    pub page_size: u32,
    /// Objects that fail the incoming schema named per CRD (the rest are counted).
    pub max_named: usize,
    /// Longest wait for one answer.
    pub request_timeout: Duration,
}

/// The VersionPolicies of the cluster: empty where their CRD is not installed; `Err` where
/// they may not be listed (then nobody knows which CRDs they govern).
pub async fn policies(client: &Client) -> Result<Vec<VersionPolicy>, String> {
    let api: Api<kube::core::DeserializeGuard<VersionPolicy>> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items.into_iter().filter_map(|guard| guard.0.ok()).collect()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
        Err(error) => Err(describe("list versionpolicies.crdlifecycle.io", &error)),
    }
}

/// A failed request in words; a 403 is a missing permission, said so.
pub fn describe(what: &str, error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if status.code == 403 => {
            format!("permission missing: cannot {what}: {}", status.message)
        }
        kube::Error::Api(status) => format!(
            "cannot {what}: {} {}: {}",
            status.code, status.reason, status.message
        ),
        other => format!("cannot {what}: {other}"),
    }
}

/// The policy governing `crd`, with its last measured migration rate.
pub fn governing(policies: &[VersionPolicy], crd: &str) -> Option<Governing> {
    let policy = policies.iter().find(|p| p.spec.crd_name == crd)?;
    let migration = policy.status.as_ref().and_then(|s| s.migration.as_ref());
    let rate = migration
        .filter(|m| m.phase == MigrationPhase::Succeeded)
        .and_then(|m| {
            let seconds = m
                .finished_at
                .as_ref()?
                .0
                .duration_since(m.started_at.as_ref()?.0)
                .as_secs_f64();
            let objects = (m.rewritten + m.skipped) as f64;
            (seconds > 0.0 && objects > 0.0).then_some(objects / seconds)
        });
    Some(Governing {
        name: policy.metadata.name.clone().unwrap_or_default(),
        suspended: policy.spec.suspend,
        rate,
        migrating: migration.is_some_and(|m| m.phase == MigrationPhase::Running),
        conversion: policy.spec.conversion.clone(),
    })
}

/// Reads what the findings about `incoming` need, and nothing more.
pub async fn observe(
    client: &Client,
    incoming: &CustomResourceDefinition,
    policies: &Result<Vec<VersionPolicy>, String>,
    settings: &ReadSettings,
) -> Observed {
    let name = incoming.metadata.name.clone().unwrap_or_default();
    let mut observed = Observed::default();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let live = match crds.get_opt(&name).await {
        Ok(live) => live,
        Err(error) => {
            observed
                .unchecked
                .push(describe(&format!("get customresourcedefinition {name}"), &error));
            return observed;
        }
    };
    let Some(live) = live else { return observed };
    // Kubernetes' migrations of its resource (an unfinished or failed one may have trimmed
    // storedVersions early).
    match migrate::builtin::Migrations::discover(client).await {
        Ok(None) => {}
        Ok(Some(api)) => {
            let (plural, group) = name.split_once('.').unwrap_or((name.as_str(), ""));
            match api.of_resource(group, plural).await {
                Ok(listed) => observed.migrations = listed.migrations,
                Err(error) => observed.unchecked.push(describe(
                    "list storageversionmigrations.storagemigration.k8s.io",
                    &error,
                )),
            }
        }
        Err(error) => observed
            .unchecked
            .push(describe("discover storagemigration.k8s.io", &error)),
    }
    match policies {
        Ok(policies) => observed.governed_by = governing(policies, &name),
        Err(reason) => observed.unchecked.push(format!(
            "whether a VersionPolicy governs {name} is unknown: {reason}"
        )),
    }
    let versions_after = |v: &str| incoming.spec.versions.iter().find(|i| i.name == v);
    // A version that stops being served or disappears: who writes through it, and which
    // objects' managedFields name it.
    let loses_a_version = live
        .spec
        .versions
        .iter()
        .any(|v| versions_after(&v.name).is_none_or(|after| v.served && !after.served));
    if loses_a_version {
        let listing = migrate::ListSettings {
            page_size: settings.page_size,
            request_timeout: settings.request_timeout,
            ..migrate::ListSettings::default()
        };
        match crate::audit::read_writes(client, &live, &listing, None).await {
            Ok(writes) => {
                observed.objects = Some(writes.objects);
                observed.managed_fields = Some(writes);
            }
            Err(error) => observed
                .unchecked
                .push(format!("the objects' managedFields could not be listed: {error}")),
        }
    }
    // Objects to rewrite: how many.
    let mut with_stored = incoming.clone();
    with_stored.status = live.status.clone();
    let storage = |crd: &CustomResourceDefinition| {
        crd.spec
            .versions
            .iter()
            .find(|v| v.storage)
            .map(|v| v.name.clone())
    };
    let missing = !apiserver_rules::missing_stored_versions(&with_stored).is_empty();
    let rewrite = missing || storage(&live) != storage(incoming);
    // The apiserver's own words for the refusal, on any version.
    if missing {
        observed.dry_run = dry_run_update(client, &live, incoming, settings.request_timeout).await;
    }
    if rewrite && observed.objects.is_none() {
        let counting = migrate::Settings {
            request_timeout: settings.request_timeout,
            ..migrate::Settings::default()
        };
        match migrate::count_objects(client, &name, &counting).await {
            Ok(count) => observed.objects = count,
            Err(error) => observed
                .unchecked
                .push(format!("the objects could not be counted: {error}")),
        }
    }
    // Objects against the incoming schema, where it differs from the live one.
    if let Some((version, schema)) = schema_to_validate(&live, incoming) {
        match validate_objects(client, &live, &version, &schema, settings).await {
            Ok(validated) => observed.validated = Some(validated),
            Err(error) => observed.unchecked.push(format!(
                "the objects could not be checked against the incoming {version} schema: {error}"
            )),
        }
    }
    observed.live = Some(live);
    observed
}

/// Who the dry run's request names as its field manager (nothing is written).
const DRY_RUN_FIELD_MANAGER: &str = "crd-lifecycle-check";

/// A dry run (`dryRun=All`) of updating the live CRD to `incoming`, at the live
/// resourceVersion: the causes of the apiserver's 422 (the status stays the live one, so a
/// stored version missing from the incoming versions is refused in the words of that
/// apiserver: tests/fixtures/apiserver/crd-dry-run-update-rejected-v1.36.txt), or none where
/// it accepts. `None` where it could not be asked: no `update` permission on the CRD (403,
/// tests/fixtures/apiserver/crd-dry-run-update-forbidden-v1.36.txt), a change meanwhile
/// (409), a webhook without dry-run support, no answer in time; the findings then word the
/// refusal by the server's version.
async fn dry_run_update(
    client: &Client,
    live: &CustomResourceDefinition,
    incoming: &CustomResourceDefinition,
    timeout: Duration,
) -> Option<Vec<Cause>> {
    let name = live.metadata.name.clone().unwrap_or_default();
    let mut crd = incoming.clone();
    crd.metadata.resource_version = live.metadata.resource_version.clone();
    crd.status = None;
    let params = PostParams {
        dry_run: true,
        field_manager: Some(DRY_RUN_FIELD_MANAGER.to_owned()),
    };
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match tokio::time::timeout(timeout, api.replace(&name, &params, &crd)).await {
        Ok(Ok(_)) => Some(Vec::new()),
        Ok(Err(kube::Error::Api(status))) if status.code == 422 => Some(
            status
                .details
                .map(|details| details.causes)
                .unwrap_or_default()
                .into_iter()
                .map(|cause| Cause {
                    field: cause.field,
                    message: cause.message,
                })
                .collect(),
        ),
        _ => None,
    }
}

/// The version whose objects are checked against the incoming schema, and that schema:
/// the incoming storage version if the live CRD serves it, else the live storage version if
/// the incoming CRD has it; only when its incoming schema differs from the live one (an
/// unchanged schema finds nothing new).
fn schema_to_validate(
    live: &CustomResourceDefinition,
    incoming: &CustomResourceDefinition,
) -> Option<(String, Value)> {
    let served_live = |name: &str| live.spec.versions.iter().find(|v| v.name == name && v.served);
    let incoming_storage = incoming.spec.versions.iter().find(|v| v.storage);
    let live_storage = live.spec.versions.iter().find(|v| v.storage && v.served);
    let version = incoming_storage
        .filter(|v| served_live(&v.name).is_some())
        .or_else(|| live_storage.and_then(|s| incoming.spec.versions.iter().find(|v| v.name == s.name)))?;
    let after = schema_json(version)?;
    let before = served_live(&version.name).and_then(schema_json);
    (before.as_ref() != Some(&after)).then(|| (version.name.clone(), after))
}

/// Reads every object through `version` (full pages: the schema needs bodies) and checks it
/// against `schema`. The next page is fetched while the current one is checked.
async fn validate_objects(
    client: &Client,
    live: &CustomResourceDefinition,
    version: &str,
    schema: &Value,
    settings: &ReadSettings,
) -> Result<Validated, String> {
    let root = Schema::parse(schema);
    let path = format!("/apis/{}/{version}/{}", live.spec.group, live.spec.names.plural);
    let mut validated = Validated {
        version: version.to_owned(),
        checked: 0,
        invalid: 0,
        first: Vec::new(),
    };
    let mut page = list_page(client, &path, settings, None).await?;
    loop {
        let (items, next) = page;
        let fetching = async {
            match &next {
                Some(token) => list_page(client, &path, settings, Some(token)).await.map(Some),
                None => Ok(None),
            }
        };
        let checking = async {
            for object in &items {
                validated.checked += 1;
                if let Some(problem) = schema::validate(&root, object).into_iter().next() {
                    validated.invalid += 1;
                    if validated.first.len() < settings.max_named {
                        validated.first.push(ObjectProblem {
                            object: crate::conversion::object_name(object),
                            path: problem.path,
                            message: problem.message,
                        });
                    }
                }
            }
        };
        let (fetched, ()) = futures::join!(fetching, checking);
        match fetched? {
            Some(fetched) => page = fetched,
            None => return Ok(validated),
        }
    }
}

/// The items of a 2xx list answer. One that is not a list (a proxy's page, a truncated
/// body) is an error, never an empty page: an empty page would pass every object unchecked.
fn items_of(path: &str, code: u16, value: Value, body: &[u8]) -> Result<Vec<Value>, String> {
    match value {
        Value::Object(mut list) => match list.remove("items") {
            Some(Value::Array(items)) => Ok(items),
            // `items: null` is how an empty list may be encoded.
            Some(Value::Null) | None
                if list
                    .get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List")) =>
            {
                Ok(Vec::new())
            }
            _ => Err(format!("listing {path} answered {code} without a list of items")),
        },
        _ => Err(format!(
            "listing {path} answered {code} with a body that is not a JSON list: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
        )),
    }
}

/// One page of full objects and the next continue token. A 410 for an expired token goes on
/// with the fresh token its Status carries (samples 27, 28).
async fn list_page(
    client: &Client,
    path: &str,
    settings: &ReadSettings,
    token: Option<&str>,
) -> Result<(Vec<Value>, Option<String>), String> {
    let mut token = token.map(str::to_owned);
    for _ in 0..10 {
        let mut params = ListParams::default().limit(settings.page_size);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let request = kube::core::Request::new(path)
            .list(&params)
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let response = client
                .send(request.map(Body::from))
                .await
                .map_err(|e| e.to_string())?;
            let code = response.status().as_u16();
            let body = response
                .into_body()
                .collect_bytes()
                .await
                .map_err(|e| e.to_string())?;
            let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            Ok::<_, String>((code, value, body))
        };
        let (code, value, body) = tokio::time::timeout(settings.request_timeout, exchange)
            .await
            .map_err(|_| format!("listing {path}: no answer within {:?}", settings.request_timeout))??;
        if code == 410
            && let Some(fresh) = value["metadata"]["continue"].as_str().filter(|t| !t.is_empty())
        {
            token = Some(fresh.to_owned());
            continue;
        }
        if !(200..300).contains(&code) {
            let message = value["message"]
                .as_str()
                .map_or_else(|| String::from_utf8_lossy(&body).trim().to_owned(), str::to_owned);
            return Err(match code {
                403 => format!("permission missing: {message}"),
                _ => format!("listing {path} answered {code}: {message}"),
            });
        }
        let next = value["metadata"]["continue"]
            .as_str()
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        let items = items_of(path, code, value, &body)?;
        return Ok((items, next));
    }
    Err(format!("listing {path}: the continue token kept expiring"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::items_of;

    #[test]
    fn a_page_that_is_not_a_list_is_an_error_not_an_empty_page() {
        let path = "/apis/example.com/v1/widgets";
        let html = b"<html>502 Bad Gateway</html>";
        let error = items_of(path, 200, serde_json::Value::Null, html).expect_err("not a list");
        assert!(
            error.contains("not a JSON list: <html>502 Bad Gateway</html>"),
            "{error}"
        );
        assert!(items_of(path, 200, json!({"kind": "Status"}), b"{}").is_err());
        assert_eq!(
            items_of(path, 200, json!({"kind": "WidgetList", "items": null}), b"{}"),
            Ok(Vec::new())
        );
        assert_eq!(
            items_of(
                path,
                200,
                json!({"kind": "WidgetList", "items": [{"a": 1}]}),
                b"{}"
            ),
            Ok(vec![json!({"a": 1})])
        );
    }
}
