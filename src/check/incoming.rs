//! The incoming CRDs: read from files, directories and stdin (a rendered chart, a
//! `kustomize build`, any multi-document YAML or JSON, `List`s included); documents that are
//! not CRDs are skipped and counted.

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use crate::manifest;

/// One incoming CRD and where it came from.
#[derive(Clone, Debug)]
pub struct IncomingCrd {
    /// `path` (or `<stdin>`) and, in a multi-document source, `#N` (1-based).
    pub origin: String,
    pub crd: CustomResourceDefinition,
}

/// Everything read from the paths.
#[derive(Clone, Debug, Default)]
pub struct Incoming {
    pub crds: Vec<IncomingCrd>,
    /// Documents that are not CRDs (Deployments, ConfigMaps, ...).
    pub skipped: usize,
}

impl Incoming {
    /// The CRDs of one source's text (`origin` names it in messages).
    pub fn parse(text: &str, origin: &str) -> Result<Incoming, Error> {
        let mut incoming = Incoming::default();
        add(&mut incoming, text, origin)?;
        Ok(incoming)
    }
}

/// Why the incoming CRDs could not be read (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Manifest(#[from] manifest::Error),
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    #[error("{0}: no CustomResourceDefinition found (documents that are not CRDs are skipped)")]
    NoCrd(String),
}

/// Reads every path (`-` for stdin; a directory's `.yaml`, `.yml` and `.json` files, in
/// name order, recursively).
pub fn read(paths: &[String]) -> Result<Incoming, Error> {
    let mut incoming = Incoming::default();
    for path in paths {
        if path != "-" && Path::new(path).is_dir() {
            let mut files = Vec::new();
            walk(Path::new(path), &mut files)?;
            for file in files {
                let text = manifest::read_source(&file)?;
                add(&mut incoming, &text, &file)?;
            }
        } else {
            let text = manifest::read_source(path)?;
            add(&mut incoming, &text, &manifest::origin_of(path))?;
        }
    }
    if incoming.crds.is_empty() {
        let origins: Vec<String> = paths.iter().map(|p| manifest::origin_of(p)).collect();
        return Err(Error::NoCrd(origins.join(", ")));
    }
    // The same CRD twice: the later document wins when applied, so only it is checked.
    let mut seen = std::collections::BTreeSet::new();
    let mut kept: Vec<IncomingCrd> = Vec::new();
    for crd in incoming.crds.into_iter().rev() {
        if seen.insert(crd.crd.metadata.name.clone()) {
            kept.push(crd);
        }
    }
    kept.reverse();
    incoming.crds = kept;
    Ok(incoming)
}

fn walk(dir: &Path, files: &mut Vec<String>) -> Result<(), Error> {
    let read_error = |source| Error::Read {
        path: dir.display().to_string(),
        source,
    };
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(read_error)?
        .collect::<Result<_, _>>()
        .map_err(read_error)?;
    entries.sort_by_key(|e| e.path());
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, files)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
        {
            files.push(path.display().to_string());
        }
    }
    Ok(())
}

/// Parses one source's documents (YAML or JSON), unpacking `List`s.
pub fn add(incoming: &mut Incoming, text: &str, origin: &str) -> Result<(), Error> {
    let documents = manifest::parse_documents(text, origin)?;
    let several = documents.len() > 1;
    for (index, document) in documents.into_iter().enumerate() {
        let origin = if several {
            format!("{origin}#{}", index + 1)
        } else {
            origin.to_owned()
        };
        let items = match document.get("kind").and_then(Value::as_str) {
            Some(kind) if kind.ends_with("List") && document.get("items").is_some_and(Value::is_array) => {
                document["items"].as_array().cloned().unwrap_or_default()
            }
            _ => vec![document],
        };
        for item in items {
            add_document(incoming, item, &origin)?;
        }
    }
    Ok(())
}

fn add_document(incoming: &mut Incoming, document: Value, origin: &str) -> Result<(), Error> {
    if document.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
        incoming.skipped += 1;
        return Ok(());
    }
    let invalid = |message: String| Error::Invalid {
        origin: origin.to_owned(),
        message,
    };
    match document.get("apiVersion").and_then(Value::as_str) {
        Some("apiextensions.k8s.io/v1") => {}
        Some("apiextensions.k8s.io/v1beta1") => {
            return Err(invalid(
                "apiVersion: apiextensions.k8s.io/v1beta1 is not served since Kubernetes 1.22; convert the CRD to apiextensions.k8s.io/v1".to_owned(),
            ));
        }
        other => {
            return Err(invalid(format!(
                "apiVersion: expected \"apiextensions.k8s.io/v1\", found {}",
                other.map_or("nothing".to_owned(), |o| format!("{o:?}"))
            )));
        }
    }
    // Fields a server sets (`status`) are ignored; anything else unknown is an error.
    let mut document = document;
    if let Some(object) = document.as_object_mut() {
        object.remove("status");
    }
    let crd: CustomResourceDefinition = manifest::from_value(document)
        .map_err(|errors| invalid(format!("not a valid CustomResourceDefinition:\n{errors}")))?;
    let name = crd.metadata.name.as_deref().unwrap_or_default();
    let expected = format!("{}.{}", crd.spec.names.plural, crd.spec.group);
    if name != expected {
        return Err(invalid(format!(
            "metadata.name: {name:?} must be spec.names.plural + \".\" + spec.group ({expected:?})"
        )));
    }
    incoming.crds.push(IncomingCrd {
        origin: origin.to_owned(),
        crd,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}
";

    #[test]
    fn crds_are_read_and_other_documents_counted() {
        let text = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n---\n{CRD}---\n{{\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": [{{\"apiVersion\": \"v1\", \"kind\": \"Service\"}}]}}\n"
        );
        let mut incoming = Incoming::default();
        add(&mut incoming, &text, "chart.yaml").expect("reads");
        assert_eq!(incoming.crds.len(), 1);
        assert_eq!(incoming.crds[0].origin, "chart.yaml#2");
        assert_eq!(incoming.skipped, 2);
    }

    #[test]
    fn bad_crds_name_the_document_and_field() {
        let mut incoming = Incoming::default();
        let error = add(&mut incoming, &CRD.replace("scope:", "scopes:"), "crd.yaml")
            .expect_err("unknown field")
            .to_string();
        assert!(
            error.starts_with("crd.yaml: not a valid CustomResourceDefinition:"),
            "{error}"
        );
        assert!(error.contains("spec.scopes"), "{error}");
        let error = add(
            &mut incoming,
            &CRD.replace("apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1"),
            "old.yaml",
        )
        .expect_err("v1beta1")
        .to_string();
        assert!(error.contains("not served since Kubernetes 1.22"), "{error}");
        let error = add(
            &mut incoming,
            &CRD.replace("name: widgets.example.com", "name: w"),
            "n.yaml",
        )
        .expect_err("name")
        .to_string();
        assert!(error.contains("metadata.name"), "{error}");
    }
}
