//! Reading manifests (YAML or JSON, a file or `-` for stdin) into typed objects, with
//! errors that name the file and the field path.

use std::io::Read;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::api::VersionPolicy;
use crate::lifecycle::FieldErrors;

/// Failures reading a manifest.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{origin}: cannot read: {source}")]
    Read {
        origin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: not valid YAML or JSON: {message}")]
    Syntax { origin: String, message: String },
    #[error("{origin}: expected exactly one document, found {count}")]
    DocumentCount { origin: String, count: usize },
    #[error("{origin}: {count} problem{plural}:\n{errors}", count = errors.len(), plural = if errors.len() == 1 { "" } else { "s" })]
    Fields { origin: String, errors: FieldErrors },
}

impl Error {
    /// Short stable label, for metrics and event reasons.
    pub fn label(&self) -> &'static str {
        match self {
            Error::Read { .. } => "Read",
            Error::Syntax { .. } => "Syntax",
            Error::DocumentCount { .. } => "DocumentCount",
            Error::Fields { .. } => "Fields",
        }
    }
}

/// Reads a file, or stdin for `-`.
pub fn read_source(path: &str) -> Result<String, Error> {
    let origin = origin_of(path);
    let mut text = String::new();
    let result = if path == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    result.map_err(|source| Error::Read { origin, source })?;
    Ok(text)
}

/// How a source is named in messages.
/// The first document of a file (`-` for stdin), e.g. a CRD manifest.
pub fn read_document(path: &str) -> Result<Value, Error> {
    let origin = origin_of(path);
    parse_documents(&read_source(path)?, &origin)?
        .into_iter()
        .next()
        .ok_or(Error::DocumentCount { origin, count: 0 })
}

pub fn origin_of(path: &str) -> String {
    if path == "-" {
        "<stdin>".to_owned()
    } else {
        path.to_owned()
    }
}

/// Parses YAML (a superset of JSON) holding every document as JSON values; empty documents
/// (a lone `---`) are skipped.
pub fn parse_documents(text: &str, origin: &str) -> Result<Vec<Value>, Error> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| Error::Syntax {
        origin: origin.to_owned(),
        message: e.to_string(),
    })?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// Parses exactly one document.
pub fn parse_single(text: &str, origin: &str) -> Result<Value, Error> {
    let mut documents = parse_documents(text, origin)?;
    if documents.len() != 1 {
        return Err(Error::DocumentCount {
            origin: origin.to_owned(),
            count: documents.len(),
        });
    }
    Ok(documents.remove(0))
}

/// Converts a JSON value to `T`, reporting every field `T` does not know and the first
/// type error, each by its path (e.g. `spec.versions[1].unserve.foo`). Top-level
/// `apiVersion` and `kind` are left to the caller.
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, FieldErrors> {
    let mut errors = FieldErrors::default();
    let mut unknown = Vec::new();
    let mut record = |path: serde_ignored::Path<'_>| unknown.push(ignored_path(&path));
    let deserializer = serde_ignored::Deserializer::new(value, &mut record);
    let result: Result<T, _> = serde_path_to_error::deserialize(deserializer);
    // kube's generated CustomResource types take apiVersion and kind from the type rather
    // than the document, so they arrive here as ignored; callers check them.
    for path in unknown.into_iter().filter(|p| p != "apiVersion" && p != "kind") {
        errors.push(path, "unknown field");
    }
    match result {
        Ok(typed) if errors.is_empty() => Ok(typed),
        Ok(_) => Err(errors),
        Err(e) => {
            let path = e.path().to_string();
            errors.push(
                if path == "." {
                    "(document)".to_owned()
                } else {
                    path
                },
                e.into_inner().to_string(),
            );
            Err(errors)
        }
    }
}

/// Parses a VersionPolicy manifest.
pub fn parse_policy(text: &str, origin: &str) -> Result<VersionPolicy, Error> {
    let value = parse_single(text, origin)?;
    typed_object(value, origin, "crdlifecycle.io/v1alpha1", "VersionPolicy")
}

/// Parses a CustomResourceDefinition manifest, returning it typed and as the original JSON
/// value (so that rendering it keeps every field, known or not).
pub fn parse_crd(text: &str, origin: &str) -> Result<(CustomResourceDefinition, Value), Error> {
    let value = parse_single(text, origin)?;
    let typed = typed_object(
        value.clone(),
        origin,
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
    )?;
    Ok((typed, value))
}

fn typed_object<T: DeserializeOwned>(
    value: Value,
    origin: &str,
    api_version: &str,
    kind: &str,
) -> Result<T, Error> {
    let fields_error = |errors| Error::Fields {
        origin: origin.to_owned(),
        errors,
    };
    let mut errors = FieldErrors::default();
    for (field, expected) in [("apiVersion", api_version), ("kind", kind)] {
        let found = value.get(field).and_then(Value::as_str);
        if found != Some(expected) {
            errors.push(
                field,
                format!(
                    "expected {expected:?}, found {}",
                    found.map_or("nothing".into(), |f| format!("{f:?}"))
                ),
            );
        }
    }
    if !errors.is_empty() {
        return Err(fields_error(errors));
    }
    from_value(value).map_err(fields_error)
}

fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        Path::Map { parent, key } => {
            let parent = ignored_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => {
            ignored_path(parent)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = "apiVersion: crdlifecycle.io/v1alpha1
kind: VersionPolicy
metadata: {name: widgets}
spec:
  crdName: widgets.example.com
  versions:
  - name: v1
    store: {at: \"2026-02-01T00:00:00Z\"}
";

    #[test]
    fn parses_a_policy() {
        let policy = parse_policy(POLICY, "p.yaml").expect("valid policy");
        assert_eq!(policy.spec.crd_name, "widgets.example.com");
        assert_eq!(
            policy.spec.versions[0]
                .store
                .as_ref()
                .and_then(|m| m.at.as_deref()),
            Some("2026-02-01T00:00:00Z")
        );
        assert!(policy.spec.migration.enabled, "migration defaults to enabled");
    }

    #[test]
    fn reports_every_unknown_field_by_path() {
        let text = POLICY
            .replace("store: {at:", "store: {bogus: 1, at:")
            .replace("crdName:", "extra: x\n  crdName:");
        let error = parse_policy(&text, "p.yaml").expect_err("unknown fields");
        let Error::Fields { errors, .. } = error else {
            panic!("wrong error: {error}")
        };
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["spec.extra", "spec.versions[0].store.bogus"]);
    }

    #[test]
    fn reports_type_errors_by_path() {
        let text = POLICY.replace(
            "crdName: widgets.example.com",
            "crdName: widgets.example.com\n  suspend: maybe",
        );
        let message = parse_policy(&text, "p.yaml").expect_err("bad bool").to_string();
        assert!(message.contains("\n  spec.suspend: invalid type"), "{message}");
    }

    #[test]
    fn rejects_wrong_kind_and_several_documents() {
        let wrong = POLICY.replace("kind: VersionPolicy", "kind: Widget");
        let message = parse_policy(&wrong, "p.yaml")
            .expect_err("wrong kind")
            .to_string();
        assert!(
            message.contains("kind: expected \"VersionPolicy\", found \"Widget\""),
            "{message}"
        );
        let two = format!("{POLICY}---\n{POLICY}");
        assert!(matches!(
            parse_policy(&two, "p.yaml"),
            Err(Error::DocumentCount { count: 2, .. })
        ));
        assert!(matches!(
            parse_policy("a: [", "p.yaml"),
            Err(Error::Syntax { .. })
        ));
    }
}
