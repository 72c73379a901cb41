//! `crd-lifecycle convert`: offline conversion of objects with a policy's
//! `spec.conversion`, through the same code as the webhook.

use std::io::Write;

use serde_json::Value;

use crate::conversion::{Converter, object_name};
use crate::lifecycle::FieldErrors;
use crate::manifest::{self, origin_of};

/// Failures of `convert`; all of them are bad input (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Manifest(#[from] manifest::Error),
    #[error("{origin}: the policy has no spec.conversion")]
    NoConversion { origin: String },
    #[error("{origin}: invalid spec.conversion ({} problem{}):\n{errors}", errors.len(), if errors.len() == 1 { "" } else { "s" })]
    InvalidConversion { origin: String, errors: FieldErrors },
    #[error("{origin}: document {index} ({name}): {message}")]
    Object {
        origin: String,
        index: usize,
        name: String,
        message: String,
    },
    #[error("--policy and the objects cannot both be read from stdin")]
    BothFromStdin,
    #[error("cannot write the output: {0}")]
    Output(String),
}

/// How `convert` prints the objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectFormat {
    Yaml,
    Json,
}

/// What `convert` converts.
#[derive(Clone, Debug)]
pub struct ConvertSettings {
    /// The VersionPolicy whose spec.conversion to use (`-` for stdin).
    pub policy: String,
    /// The version to convert to.
    pub to: String,
    pub output: ObjectFormat,
    /// The objects (YAML or JSON, several documents allowed; `-` for stdin).
    pub objects: String,
    /// The CRD: coverage of its schemas, and every output validated against the target
    /// version's schema.
    pub crd: Option<String>,
}

/// Converts every document of the input and writes them out, in order.
pub fn run(args: &ConvertSettings, out: &mut impl Write) -> Result<(), Error> {
    if args.policy == "-" && args.objects == "-" {
        return Err(Error::BothFromStdin);
    }
    let policy_origin = origin_of(&args.policy);
    let policy = manifest::parse_policy(&manifest::read_source(&args.policy)?, &policy_origin)?;
    let spec = policy
        .spec
        .conversion
        .as_ref()
        .ok_or_else(|| Error::NoConversion {
            origin: policy_origin.clone(),
        })?;
    let converter = Converter::for_spec(spec).map_err(|errors| Error::InvalidConversion {
        origin: policy_origin.clone(),
        errors,
    })?;
    let schemas = match &args.crd {
        Some(crd) => {
            let crd = manifest::read_document(crd)?;
            let schemas = crate::schema::version_schemas(&crd);
            let uncovered = crate::conversion::coverage::check(spec, &converter, &schemas);
            if !uncovered.is_empty() {
                return Err(Error::InvalidConversion {
                    origin: policy_origin,
                    errors: uncovered,
                });
            }
            schemas
        }
        None => Default::default(),
    };
    let origin = origin_of(&args.objects);
    // A `List` (as `kubectl get -o yaml` prints) stands for its items.
    let documents: Vec<Value> = manifest::parse_documents(&manifest::read_source(&args.objects)?, &origin)?
        .into_iter()
        .flat_map(|document| match document.get("kind").and_then(Value::as_str) {
            Some(kind) if kind == "List" || kind.ends_with("List") && document.get("items").is_some() => {
                document
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            }
            _ => vec![document],
        })
        .collect();
    let converted = documents
        .iter()
        .enumerate()
        .map(|(index, object)| {
            let object_error = |message: String| Error::Object {
                origin: origin.clone(),
                index: index + 1,
                name: describe(object),
                message,
            };
            let converted = converter
                .convert(object, &args.to)
                .map_err(|e| object_error(e.to_string()))?;
            // What the apiserver would prune or reject in the target version.
            if let Some(schema) = schemas.get(&args.to)
                && let Some(problem) = crate::schema::validate(schema, &converted).into_iter().next()
            {
                return Err(object_error(format!(
                    "the converted object does not fit {}'s schema: {problem}",
                    args.to
                )));
            }
            Ok(converted)
        })
        .collect::<Result<Vec<Value>, Error>>()?;
    let text = match args.output {
        // One object as itself, several as a `v1` List (what kubectl reads).
        ObjectFormat::Json => {
            let document = match converted.as_slice() {
                [single] => single.clone(),
                _ => serde_json::json!({"apiVersion": "v1", "kind": "List", "items": converted}),
            };
            let mut text =
                serde_json::to_string_pretty(&document).map_err(|e| Error::Output(e.to_string()))?;
            text.push('\n');
            text
        }
        ObjectFormat::Yaml => {
            serde_saphyr::to_string_multiple(&converted).map_err(|e| Error::Output(e.to_string()))?
        }
    };
    out.write_all(text.as_bytes())
        .map_err(|e| Error::Output(e.to_string()))
}

fn describe(object: &Value) -> String {
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("object");
    format!("{kind} {}", object_name(object))
}
