//! Every CRD this project installs uses only formats the apiserver knows: v1.36 answers an
//! unknown one (e.g. `uint32`) with `Warning: 299 - "unrecognized format ..."`, which
//! `kubectl apply` prints (apiserver-samples/34).

use serde_json::Value;

/// The formats the apiserver knows: kube-openapi's `strfmt.Default` registry (the string
/// formats) and the numeric formats its validator checks (`int32`, `int64`, `float`,
/// `double`), as listed in the Kubernetes docs on CRD validation.
const KNOWN_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "date-time",
    "int32",
    "int64",
    "float",
    "double",
];

fn formats(schema: &Value, path: &str, found: &mut Vec<(String, String)>) {
    match schema {
        Value::Object(fields) => {
            if let Some(Value::String(format)) = fields.get("format") {
                found.push((path.to_owned(), format.clone()));
            }
            for (key, child) in fields {
                formats(child, &format!("{path}.{key}"), found);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                formats(item, &format!("{path}[{i}]"), found);
            }
        }
        _ => {}
    }
}

#[test]
fn installed_crds_use_only_formats_the_apiserver_knows() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for dir in ["crds", "deploy"] {
        let mut stack = vec![root.join(dir)];
        while let Some(path) = stack.pop() {
            if path.is_dir() {
                stack.extend(std::fs::read_dir(&path).expect("dir").flatten().map(|e| e.path()));
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            let Ok(documents) = serde_saphyr::from_multiple::<Value>(&text) else {
                continue;
            };
            for document in documents {
                if document["kind"] != "CustomResourceDefinition" {
                    continue;
                }
                checked += 1;
                let mut found = Vec::new();
                formats(&document["spec"], "spec", &mut found);
                for (at, format) in found {
                    assert!(
                        KNOWN_FORMATS.contains(&format.as_str()),
                        "{}: {at}: format {format:?} is unknown to the apiserver",
                        path.display()
                    );
                }
            }
        }
    }
    assert!(checked >= 1, "no CRD found");
}
