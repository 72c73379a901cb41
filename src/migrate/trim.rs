//! The last step of a run: trimming `status.storedVersions` to the storage version.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::crd_reads::{kube_request, read_current};
use super::discovery::{self, Expect};
use super::requests::Requester;
use super::{Error, Settings, StorageGuard, Target, Verdict};

pub(super) enum TrimResult {
    Trimmed(Vec<String>),
    NotTrimmed(String),
    /// Objects may have been stored in another version during the run (the reason): the
    /// rewrites must start over.
    StorageChanged(String),
}

/// Sets `status.storedVersions` to the storage version alone, only if every state of the
/// CRD since the run started had that storage version (`guard`, which must have seen the
/// very state the trim acts on), the conversion is the one the run went through, and
/// discovery confirms the storage version at the resourceVersion the trim is made at,
/// which the patch carries as a precondition (the apiserver itself accepts any trim,
/// apiserver-samples/14).
///
/// `confirmed_at`: the resourceVersion the storage version was confirmed at before the
/// rewrites. A CRD still at it has not changed since, so the trim needs no second
/// confirmation; any other state (after a change, or after a 409 on the trim itself) is
/// confirmed by the settle check on the CRD as just read.
pub(super) async fn trim(
    requester: &Requester<'_>,
    target: &Target,
    guard: &StorageGuard,
    settings: &Settings,
    confirmed_at: Option<String>,
) -> Result<TrimResult, Error> {
    let client = requester.client;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut confirmed_at = confirmed_at;
    for _ in 0..5 {
        let now = read_current(client, &target.crd, settings).await?;
        if now.storage_version != target.storage_version {
            return Ok(TrimResult::StorageChanged(format!(
                "the storage version changed from {} to {}",
                target.storage_version, now.storage_version
            )));
        }
        // The storage version changed and changed back (or more) during the run: objects
        // written meanwhile are stored in a version the run did not rewrite them into,
        // whether or not storedVersions gained it.
        if let Verdict::Changed(why) = guard.check(&now).await {
            return Ok(TrimResult::StorageChanged(why));
        }
        // Other changes (a deprecation, a served flag) leave every rewritten object in the
        // storage version: only a change of what the rewrite converted through asks for a
        // new run.
        if now.conversion != target.conversion {
            return Ok(TrimResult::NotTrimmed(
                "the CRD's conversion changed during the run; run the migration again".to_owned(),
            ));
        }
        if now.stored_versions == [target.storage_version.clone()] {
            return Ok(TrimResult::Trimmed(Vec::new()));
        }
        // Trim only while every apiserver answering stores in the version every object was
        // rewritten into: confirmed for the state just read, by its own age.
        if confirmed_at.is_none() || confirmed_at != now.resource_version {
            discovery::wait(requester, &now, Expect::Storage, &settings.settle).await?;
            confirmed_at = now.resource_version.clone();
        }
        let patch = json!({
            "metadata": {"resourceVersion": now.resource_version},
            "status": {"storedVersions": [target.storage_version]},
        });
        // Retried after a timeout too: the resourceVersion precondition makes a repeat of
        // a trim that did land answer 409, and the re-read then finds it done.
        let params = PatchParams::default();
        let patch = Patch::Merge(&patch);
        let trimmed = kube_request(settings, "trimming status.storedVersions", || {
            crds.patch_status(&target.crd, &params, &patch)
        })
        .await;
        match trimmed {
            Ok(_) => return Ok(TrimResult::Trimmed(now.stored_versions)),
            Err(Error::Kube(kube::Error::Api(status))) if status.code == 409 => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(TrimResult::NotTrimmed(
        "the CRD kept changing while status.storedVersions was being trimmed".to_owned(),
    ))
}
