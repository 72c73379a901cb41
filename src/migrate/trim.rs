//! The last step of a run: trimming `status.storedVersions` to the storage version.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::discovery::{self, Expect};
use super::requests::Requester;
use super::{Error, Settings, Target, kube_request, read_crd};

pub(super) enum TrimResult {
    Trimmed(Vec<String>),
    NotTrimmed(String),
    /// Objects may have been stored in another version during the run (the reason): the
    /// rewrites must start over.
    StorageChanged(String),
}

/// Sets `status.storedVersions` to the storage version alone, only if the CRD still has
/// the storage version and conversion the run started with, with a resourceVersion
/// precondition (the apiserver itself accepts any trim, apiserver-samples/14).
///
/// `confirmed_before`: the target was confirmed through discovery before the rewrites (at its
/// resourceVersion). A CRD still at that resourceVersion has not changed since, so the
/// confirmation holds and the trim needs no second one.
pub(super) async fn trim(
    requester: &Requester<'_>,
    target: &Target,
    settings: &Settings,
    confirmed_before: bool,
) -> Result<TrimResult, Error> {
    let client = requester.client;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let confirmed_at = target.resource_version.clone().filter(|_| confirmed_before);
    let mut confirmed = false;
    for _ in 0..5 {
        let crd = read_crd(client, &target.crd, settings).await?;
        let now = Target::from_crd(&crd).map_err(|reason| Error::Unmigratable {
            crd: target.crd.clone(),
            reason,
        })?;
        if now.storage_version != target.storage_version {
            return Ok(TrimResult::StorageChanged(format!(
                "the storage version changed from {} to {}",
                target.storage_version, now.storage_version
            )));
        }
        // The storage version changed and changed back during the run: objects written
        // meanwhile are stored in a version the run did not start with (the apiserver added
        // it to storedVersions), and trimming would lose it.
        if let Some(appeared) = now
            .stored_versions
            .iter()
            .find(|v| !target.stored_versions.contains(v) && **v != target.storage_version)
        {
            return Ok(TrimResult::StorageChanged(format!(
                "objects were stored as {appeared} during the run (status.storedVersions gained it)"
            )));
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
        // Trim only while the apiserver still stores in the version every object was
        // rewritten into.
        if confirmed_at.is_some() && crd.metadata.resource_version == confirmed_at {
            confirmed = true;
        }
        if !confirmed {
            discovery::wait(requester, target, Expect::Storage, &settings.settle).await?;
            confirmed = true;
        }
        let patch = json!({
            "metadata": {"resourceVersion": crd.metadata.resource_version},
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
