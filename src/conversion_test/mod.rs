//! `crd-lifecycle test`: generates objects from each version's schema (seeded), adds given
//! example objects, converts every one to every other version and back, and checks that the
//! round trip is exact and every converted object fits its version's schema. `--record`
//! writes the conversions as a golden corpus; `--golden` checks that the policy still
//! converts a recorded corpus the same way.

mod cases;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde_json::Value;

pub use cases::{Case, Crd, Failure, check, convert_as_served, first_difference, shrink};

use crate::conversion::{Converter, coverage};
use crate::field_errors::FieldErrors;
use crate::manifest::{self, origin_of};
use crate::schema::{Rng, generate, version_schemas};

/// What `test` checks.
#[derive(Clone, Debug)]
pub struct TestSettings {
    pub policy: String,
    pub crd: String,
    /// Objects generated per version.
    pub cases: usize,
    pub seed: u64,
    /// A folder of example objects (YAML or JSON files) to check too.
    pub objects: Option<String>,
    /// Write the conversions here (one `<version>.json` per source version).
    pub record: Option<String>,
    /// Compare the conversions with a corpus written by `record`.
    pub golden: Option<String>,
}

/// Bad input (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Manifest(#[from] manifest::Error),
    #[error("{origin}: the policy has no spec.conversion")]
    NoConversion { origin: String },
    #[error("{origin}: invalid spec.conversion against {crd} ({} problem{}):\n{errors}", errors.len(), if errors.len() == 1 { "" } else { "s" })]
    InvalidConversion {
        origin: String,
        crd: String,
        errors: FieldErrors,
    },
    #[error("{crd}: {message}")]
    Crd { crd: String, message: String },
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("cannot generate {version} objects: {message}")]
    Generate { version: String, message: String },
}

/// How a test run ended (exit 0 when `failure` is none, else 1).
#[derive(Debug)]
pub struct Outcome {
    pub checked: usize,
    pub failure: Option<Failure>,
}

/// Runs the test, writing a summary (and a failure's details) to `out`.
pub fn run(settings: &TestSettings, out: &mut impl Write) -> Result<Outcome, Error> {
    let policy_origin = origin_of(&settings.policy);
    let policy = manifest::parse_policy(&manifest::read_source(&settings.policy)?, &policy_origin)?;
    let spec = policy
        .spec
        .conversion
        .as_ref()
        .ok_or_else(|| Error::NoConversion {
            origin: policy_origin.clone(),
        })?;
    let crd_origin = origin_of(&settings.crd);
    let crd_json = manifest::read_document(&settings.crd)?;
    let mut crd = crd_of(&crd_json).map_err(|message| Error::Crd {
        crd: crd_origin.clone(),
        message,
    })?;
    crd.accepted_losses = spec
        .changes
        .iter()
        .flat_map(|step| step.accept_loss.iter().map(|loss| loss.path.clone()))
        .collect();
    let governed: Vec<String> = policy.spec.versions.iter().map(|v| v.name.clone()).collect();
    let invalid = |errors| Error::InvalidConversion {
        origin: policy_origin.clone(),
        crd: crd_origin.clone(),
        errors,
    };
    let converter = Converter::new(spec, &crd.versions, &governed).map_err(invalid)?;
    let uncovered = coverage::check(spec, &converter, &crd.schemas);
    if !uncovered.is_empty() {
        return Err(invalid(uncovered));
    }

    let mut objects = Vec::new();
    let mut rng = Rng::new(settings.seed);
    for version in &crd.versions {
        let Some(schema) = crd.schemas.get(version) else {
            continue;
        };
        for i in 0..settings.cases {
            let fields = generate(schema, &mut rng).map_err(|message| Error::Generate {
                version: version.clone(),
                message,
            })?;
            objects.push(crd.object(version, &format!("{version}-case-{i}"), fields));
        }
    }
    if let Some(dir) = &settings.objects {
        objects.extend(read_objects(dir, &crd)?);
    }

    let mut corpus: BTreeMap<String, Vec<Case>> = BTreeMap::new();
    for object in &objects {
        match check(&converter, &crd, object) {
            Ok(case) => {
                let version = cases::version_of(object).unwrap_or_default().to_owned();
                corpus.entry(version).or_default().push(case);
            }
            Err(failure) => {
                let failure = shrink(&converter, &crd, *failure);
                report_failure(out, &failure);
                return Ok(Outcome {
                    checked: objects.len(),
                    failure: Some(failure),
                });
            }
        }
    }
    if let Some(dir) = &settings.golden
        && let Some(failure) = compare_golden(&converter, &crd, dir)?
    {
        report_failure(out, &failure);
        return Ok(Outcome {
            checked: objects.len(),
            failure: Some(failure),
        });
    }
    if let Some(dir) = &settings.record {
        record(dir, &corpus)?;
    }
    let _ = writeln!(
        out,
        "ok: {} objects ({} generated per version, seed {}) convert to every other version of {} and back exactly, and fit every version's schema",
        objects.len(),
        settings.cases,
        settings.seed,
        crd.versions.join(", ")
    );
    Ok(Outcome {
        checked: objects.len(),
        failure: None,
    })
}

fn report_failure(out: &mut impl Write, failure: &Failure) {
    let yaml = serde_saphyr::to_string(&failure.object).unwrap_or_else(|_| failure.object.to_string());
    let _ = writeln!(
        out,
        "FAIL {}: {}\nconversion: {}\nfield: {}\nsmallest failing object ({}):\n{yaml}",
        failure.conversion,
        failure.message,
        failure.conversion,
        if failure.path.is_empty() {
            "(the whole object)"
        } else {
            &failure.path
        },
        cases::version_of(&failure.object).unwrap_or("?"),
    );
}

/// The CRD's group, kind, scope, versions and schemas.
pub fn crd_of(crd: &Value) -> Result<Crd, String> {
    let text = |pointer: &str| {
        crd.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("{} is missing", pointer.trim_start_matches('/').replace('/', ".")))
    };
    let versions: Vec<String> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name")?.as_str().map(str::to_owned))
        .collect();
    if versions.is_empty() {
        return Err("spec.versions is empty".into());
    }
    Ok(Crd {
        group: text("/spec/group")?,
        kind: text("/spec/names/kind")?,
        namespaced: text("/spec/scope")? == "Namespaced",
        versions,
        schemas: version_schemas(crd),
        accepted_losses: Vec::new(),
    })
}

fn file_error(path: &Path, message: String) -> Error {
    Error::File {
        path: path.display().to_string(),
        message,
    }
}

/// The files of `dir` with one of these extensions, sorted.
fn files_in(dir: &str, extensions: &[&str]) -> Result<Vec<std::path::PathBuf>, Error> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| file_error(Path::new(dir), e.to_string()))?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.extension()
                .and_then(|ext| ext.to_str())
                .is_some_and(|ext| extensions.contains(&ext))
        })
        .collect();
    paths.sort();
    Ok(paths)
}

fn read_objects(dir: &str, crd: &Crd) -> Result<Vec<Value>, Error> {
    let paths = files_in(dir, &["yaml", "yml", "json"])?;
    let mut objects = Vec::new();
    for path in paths {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| file_error(&path, e.to_string()))?;
        for object in manifest::parse_documents(&text, &origin)? {
            // Other documents (the policy, the CRD) may share the folder.
            if object.get("kind").and_then(Value::as_str) != Some(crd.kind.as_str()) {
                continue;
            }
            let version = cases::version_of(&object).unwrap_or_default();
            if !crd.versions.iter().any(|v| v == version) {
                return Err(file_error(
                    &path,
                    format!(
                        "{} is a {} of version {version:?}, which the CRD does not have",
                        crate::conversion::object_name(&object),
                        crd.kind
                    ),
                ));
            }
            objects.push(object);
        }
    }
    Ok(objects)
}

fn record(dir: &str, corpus: &BTreeMap<String, Vec<Case>>) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| file_error(Path::new(dir), e.to_string()))?;
    for (version, cases) in corpus {
        let path = Path::new(dir).join(format!("{version}.json"));
        let mut text = serde_json::to_string_pretty(cases).map_err(|e| file_error(&path, e.to_string()))?;
        text.push('\n');
        std::fs::write(&path, text).map_err(|e| file_error(&path, e.to_string()))?;
    }
    Ok(())
}

/// Converts every recorded input again; the first output that differs from the recorded
/// one.
fn compare_golden(converter: &Converter, crd: &Crd, dir: &str) -> Result<Option<Failure>, Error> {
    let paths = files_in(dir, &["json"])?;
    if paths.is_empty() {
        return Err(file_error(
            Path::new(dir),
            "no recorded corpus (<version>.json) here".into(),
        ));
    }
    for path in paths {
        let text = std::fs::read_to_string(&path).map_err(|e| file_error(&path, e.to_string()))?;
        let cases: Vec<Case> = serde_json::from_str(&text).map_err(|e| file_error(&path, e.to_string()))?;
        for case in cases {
            let from = cases::version_of(&case.input).unwrap_or_default().to_owned();
            for (to, recorded) in &case.outputs {
                let conversion = format!("{from} -> {to} (golden {})", path.display());
                let now = match convert_as_served(converter, crd, &case.input, to) {
                    Ok((now, _)) => now,
                    Err((path, message)) => {
                        return Ok(Some(Failure {
                            conversion,
                            path,
                            message,
                            object: case.input,
                        }));
                    }
                };
                if let Some((field, was, is)) = first_difference(recorded, &now, "") {
                    return Ok(Some(Failure {
                        conversion,
                        path: field,
                        message: format!("the conversion changed: it gave {was}, now {is}"),
                        object: case.input,
                    }));
                }
            }
        }
    }
    Ok(None)
}
