//! `check --fix` (I/O): the steps of a `FixPlan`, through the existing machinery: a guarded
//! JSON Patch that moves the storage version back (rollback), the migrator (`Mode::Rewrite`:
//! settle check, rewrites through the live conversion, guarded trim) and its managedFields
//! cleanup (`Mode::CleanManagedFields`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::findings::{FixStep, Governing};
use crate::migrate::{self, ManagedFieldsCleanup, Mode, Outcome};

/// How one step went.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepResult {
    pub step: FixStep,
    pub done: bool,
    /// What happened, in one line.
    pub message: String,
}

/// Where progress goes: a bar on a terminal, lines otherwise (`migrate`'s display), and one
/// line per step.
pub trait FixObserver: Send + Sync {
    /// A display for one migrator run over `crd`.
    fn migrator(&self, crd: &str) -> Box<dyn migrate::Observer>;
    /// One line about a step.
    fn note(&self, crd: &str, line: &str);
}

/// Runs the steps in order; stops at the first that fails.
pub async fn apply(
    client: &Client,
    crd: &str,
    steps: &[FixStep],
    governing: Option<&Governing>,
    settings: &migrate::Settings,
    observer: &dyn FixObserver,
) -> Vec<StepResult> {
    let mut results = Vec::new();
    for step in steps {
        observer.note(crd, &describe(step));
        let outcome = match step {
            FixStep::Rollback { from, to } => rollback(client, crd, from, to).await,
            FixStep::Migrate { into } => migrate_into(client, crd, into, settings, observer).await,
            FixStep::CleanManagedFields { versions } => {
                clean(client, crd, versions, governing, settings, observer).await
            }
        };
        let (done, message) = match outcome {
            Ok(message) => (true, message),
            Err(message) => (false, message),
        };
        observer.note(crd, &message);
        results.push(StepResult {
            step: step.clone(),
            done,
            message,
        });
        if !done {
            break;
        }
    }
    results
}

/// What a step is about to do, for the log.
pub fn describe(step: &FixStep) -> String {
    match step {
        FixStep::Rollback { from, to } => {
            format!("moving the storage version back from {from} to {to}")
        }
        FixStep::Migrate { into } => {
            format!("rewriting every object into {into}, then trimming status.storedVersions")
        }
        FixStep::CleanManagedFields { versions } => format!(
            "rewriting managedFields entries naming {} into the storage version",
            versions.join(", ")
        ),
    }
}

/// The guarded patch that makes `to` the (served) storage version instead of `from`:
/// `test` operations on the resourceVersion, both versions' names and `from`'s storage flag
/// make a concurrent change answer 422 (sample 03), and the CRD is read again. `to` is
/// served in the same patch, so the CRD never has a storage version that is not served.
pub fn rollback_patch(crd: &CustomResourceDefinition, from: &str, to: &str) -> Result<Vec<Value>, String> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let index = |version: &str| {
        crd.spec
            .versions
            .iter()
            .position(|v| v.name == version)
            .ok_or_else(|| format!("{name} has no version {version}"))
    };
    let (i_from, i_to) = (index(from)?, index(to)?);
    if !crd.spec.versions[i_from].storage {
        return Err(format!("{from} is no longer the storage version of {name}"));
    }
    let mut ops = vec![
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": crd.metadata.resource_version}),
        json!({"op": "test", "path": format!("/spec/versions/{i_from}/name"), "value": from}),
        json!({"op": "test", "path": format!("/spec/versions/{i_from}/storage"), "value": true}),
        json!({"op": "test", "path": format!("/spec/versions/{i_to}/name"), "value": to}),
        json!({"op": "replace", "path": format!("/spec/versions/{i_from}/storage"), "value": false}),
        json!({"op": "replace", "path": format!("/spec/versions/{i_to}/storage"), "value": true}),
    ];
    if !crd.spec.versions[i_to].served {
        ops.push(json!({"op": "replace", "path": format!("/spec/versions/{i_to}/served"), "value": true}));
    }
    Ok(ops)
}

async fn rollback(client: &Client, crd: &str, from: &str, to: &str) -> Result<String, String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for _ in 0..3 {
        let live = api
            .get(crd)
            .await
            .map_err(|e| super::collect::describe(&format!("get customresourcedefinition {crd}"), &e))?;
        if live
            .spec
            .versions
            .iter()
            .any(|v| v.name == to && v.storage && v.served)
        {
            return Ok(format!("{to} is the storage version of {crd}"));
        }
        let ops = rollback_patch(&live, from, to)?;
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(ops)).map_err(|e| e.to_string())?;
        match api
            .patch(crd, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(_) => return Ok(format!("{to} is the storage version of {crd} again (was {from})")),
            // A failed `test`: someone changed the CRD since it was read (sample 03).
            Err(kube::Error::Api(status)) if status.code == 422 => continue,
            Err(error) => {
                return Err(super::collect::describe(
                    &format!("patch customresourcedefinition {crd}"),
                    &error,
                ));
            }
        }
    }
    Err(format!(
        "{crd} kept changing while its storage version was being moved back"
    ))
}

async fn migrate_into(
    client: &Client,
    crd: &str,
    into: &str,
    settings: &migrate::Settings,
    observer: &dyn FixObserver,
) -> Result<String, String> {
    let settings = migrate::Settings {
        mode: Mode::Rewrite,
        ..settings.clone()
    };
    let report = run_migrator(client, crd, &settings, observer).await?;
    if report.target.storage_version != into {
        return Err(format!(
            "the storage version of {crd} is {} now, not {into}: it changed meanwhile; check again",
            report.target.storage_version
        ));
    }
    match report.outcome {
        Outcome::Trimmed { .. } | Outcome::AlreadyMigrated => Ok(report.summary()),
        _ => Err(failure(&report)),
    }
}

async fn clean(
    client: &Client,
    crd: &str,
    versions: &[String],
    governing: Option<&Governing>,
    settings: &migrate::Settings,
    observer: &dyn FixObserver,
) -> Result<String, String> {
    let settings = migrate::Settings {
        mode: Mode::CleanManagedFields,
        managed_fields: ManagedFieldsCleanup {
            versions: Some(versions.to_vec()),
            conversion: governing.and_then(|g| g.conversion.clone()),
            dry_run: false,
        },
        ..settings.clone()
    };
    let report = run_migrator(client, crd, &settings, observer).await?;
    match report.outcome {
        Outcome::ManagedFieldsCleaned => Ok(report.summary()),
        _ => Err(failure(&report)),
    }
}

/// One run of the migrator with the observer's display (cleared when it ends).
async fn run_migrator(
    client: &Client,
    crd: &str,
    settings: &migrate::Settings,
    observer: &dyn FixObserver,
) -> Result<migrate::Report, String> {
    let display = observer.migrator(crd);
    migrate::migrate(client, crd, settings, display.as_ref())
        .await
        .map_err(|e| e.to_string())
}

/// The summary and the first failures of a run that did not finish.
fn failure(report: &migrate::Report) -> String {
    let mut message = report.summary();
    for failure in report.failures.iter().take(5) {
        message.push_str(&format!("\n    {failure}"));
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rollback_patch_is_guarded_and_serves_its_target() {
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": "widgets.example.com", "resourceVersion": "42"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "widgets", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": false, "storage": false},
                                  {"name": "v2", "served": true, "storage": true}]}
        }))
        .expect("crd");
        let ops = rollback_patch(&crd, "v2", "v1").expect("patch");
        assert_eq!(
            ops,
            vec![
                json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"}),
                json!({"op": "test", "path": "/spec/versions/1/name", "value": "v2"}),
                json!({"op": "test", "path": "/spec/versions/1/storage", "value": true}),
                json!({"op": "test", "path": "/spec/versions/0/name", "value": "v1"}),
                json!({"op": "replace", "path": "/spec/versions/1/storage", "value": false}),
                json!({"op": "replace", "path": "/spec/versions/0/storage", "value": true}),
                json!({"op": "replace", "path": "/spec/versions/0/served", "value": true}),
            ]
        );
        assert!(
            rollback_patch(&crd, "v1", "v2").is_err(),
            "v1 is not the storage version"
        );
    }
}
