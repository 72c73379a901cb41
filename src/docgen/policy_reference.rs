//! The VersionPolicy reference, walked from the CRD's openAPI v3 schema as `crd-lifecycle
//! crd` prints it: one section per object, a row per field with its type, constraints and
//! description (the doc comments of `src/api/`, which `kubectl explain` shows too).

use serde_json::Value;

use super::markdown::{anchor, cell, row, wrap};

/// The page `reference/versionpolicy.md`.
pub(super) fn render() -> Result<String, serde_json::Error> {
    let crd = serde_json::to_value(crd_lifecycle::api::versionpolicy_crd())?;
    let spec = &crd["spec"];
    let kind = spec["names"]["kind"].as_str().unwrap_or_default();
    let group = spec["group"].as_str().unwrap_or_default();
    let mut page = format!("# {kind} reference\n\n");
    page.push_str(&super::generated_from(
        "the CRD's schema (`crd-lifecycle crd`, the doc comments of `src/api/`)",
    ));
    page.push('\n');
    let short_names: Vec<String> = spec["names"]["shortNames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|n| format!("`{n}`"))
        .collect();
    page.push_str(&wrap(&format!(
        "`{kind}` ({group}), {} scope, plural `{}`, short name {}. `kubectl explain {}.spec` shows the \
         same descriptions; the policy's semantics are in [the lifecycle](../concepts/lifecycle.md) \
         and its validation rules in [policy validation](validation.md).",
        spec["scope"].as_str().unwrap_or_default(),
        spec["names"]["plural"].as_str().unwrap_or_default(),
        short_names.join(", "),
        spec["names"]["singular"].as_str().unwrap_or_default(),
    )));
    page.push('\n');
    for version in spec["versions"].as_array().into_iter().flatten() {
        let name = version["name"].as_str().unwrap_or_default();
        page.push_str(&format!("\n## Version `{name}`\n\n"));
        let columns: Vec<String> = version["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let priority = c["priority"].as_i64().unwrap_or(0);
                format!(
                    "| {} | `{}` | {} |\n",
                    c["name"].as_str().unwrap_or_default(),
                    cell(c["jsonPath"].as_str().unwrap_or_default()),
                    if priority > 0 { "`-o wide`" } else { "always" }
                )
            })
            .collect();
        page.push_str(&format!(
            "Served: {}, storage version: {}. `kubectl get {}` columns:\n\n| column | from | shown |\n| --- | --- | --- |\n{}",
            version["served"],
            version["storage"],
            spec["names"]["shortNames"][0].as_str().unwrap_or_default(),
            columns.concat()
        ));
        let schema = &version["schema"]["openAPIV3Schema"];
        let mut sections = Vec::new();
        collect_objects(kind, schema, &mut sections);
        for (path, object) in sections {
            page.push_str(&section(&path, object));
        }
    }
    Ok(page)
}

/// Every object schema with fields, depth first, with its path (`spec.versions[]`).
fn collect_objects<'a>(path: &str, schema: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    if let Some(properties) = schema["properties"].as_object() {
        out.push((path.to_owned(), schema));
        for (name, child) in properties {
            collect_objects(&child_path(path, name), child, out);
        }
    }
    if schema["items"].is_object() {
        collect_objects(&format!("{path}[]"), &schema["items"], out);
    }
    if schema["additionalProperties"].is_object() {
        collect_objects(&format!("{path}.*"), &schema["additionalProperties"], out);
    }
}

/// A field's path below `parent`; the root's fields are named alone.
fn child_path(parent: &str, name: &str) -> String {
    if parent.contains('.') || parent.contains('[') || parent.chars().next().is_some_and(char::is_lowercase) {
        format!("{parent}.{name}")
    } else {
        name.to_owned()
    }
}

fn section(path: &str, object: &Value) -> String {
    let mut text = format!("\n### `{path}`\n\n");
    if let Some(description) = object["description"].as_str() {
        text.push_str(&wrap(description));
        text.push_str("\n\n");
    }
    let required: Vec<&str> = object["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    text.push_str("| field | type | description |\n| --- | --- | --- |\n");
    for (name, field) in object["properties"].as_object().into_iter().flatten() {
        let mut kind = type_of(&child_path(path, name), field);
        kind.extend(constraints(field, required.contains(&name.as_str())));
        text.push_str(&row(&[
            format!("`{name}`"),
            kind.join(", "),
            field["description"].as_str().unwrap_or_default().to_owned(),
        ]));
    }
    let rules: Vec<String> = object["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|rule| {
            let message = rule["message"].as_str().unwrap_or("(no message)");
            format!(
                "| `{}` | {} |\n",
                cell(rule["rule"].as_str().unwrap_or_default()),
                cell(message)
            )
        })
        .collect();
    if !rules.is_empty() {
        text.push_str(&format!(
            "\nRules checked at admission (CEL, Kubernetes 1.25 and later):\n\n| rule | message |\n| --- | --- |\n{}",
            rules.concat()
        ));
    }
    text
}

/// The field's type, linking to the section of an object (or of an array's objects).
fn type_of(path: &str, field: &Value) -> Vec<String> {
    let link = |path: &str| format!("[object](#{})", anchor(&format!("`{path}`")));
    let base = match field["type"].as_str() {
        Some("object") if field["properties"].is_object() => link(path),
        Some("object") if field["additionalProperties"].is_object() => {
            let values = &field["additionalProperties"];
            format!("map of {}", type_of(&format!("{path}.*"), values).join(", "))
        }
        Some("array") => format!(
            "array of {}",
            type_of(&format!("{path}[]"), &field["items"])
                .first()
                .cloned()
                .unwrap_or_default()
        ),
        Some(other) => match field["format"].as_str() {
            Some(format) => format!("{other} ({format})"),
            None => other.to_owned(),
        },
        None if field["x-kubernetes-int-or-string"] == Value::Bool(true) => "integer or string".to_owned(),
        None => "any JSON value".to_owned(),
    };
    vec![base]
}

fn constraints(field: &Value, required: bool) -> Vec<String> {
    let mut found = Vec::new();
    if required {
        found.push("required".to_owned());
    }
    if let Some(values) = field["enum"].as_array() {
        let names: Vec<String> = values
            .iter()
            .filter(|v| !v.is_null())
            .map(|v| format!("`{}`", v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
            .collect();
        found.push(format!("one of {}", names.join(", ")));
    }
    if !field["default"].is_null() {
        found.push(format!("default `{}`", field["default"]));
    }
    match (field["minimum"].as_f64(), field["maximum"].as_f64()) {
        (Some(min), Some(max)) => found.push(format!("{min} to {max}")),
        (Some(min), None) => found.push(format!("at least {min}")),
        (None, Some(max)) => found.push(format!("at most {max}")),
        (None, None) => {}
    }
    match (field["minItems"].as_u64(), field["maxItems"].as_u64()) {
        (Some(min), Some(max)) => found.push(format!("{min} to {max} items")),
        (None, Some(max)) => found.push(format!("at most {max} items")),
        (Some(min), None) => found.push(format!("at least {min} items")),
        (None, None) => {}
    }
    if let Some(max) = field["maxLength"].as_u64() {
        found.push(format!("at most {max} characters"));
    }
    if let Some(keys) = field["x-kubernetes-list-map-keys"].as_array() {
        let keys: Vec<String> = keys
            .iter()
            .filter_map(Value::as_str)
            .map(|k| format!("`{k}`"))
            .collect();
        found.push(format!("a list map keyed by {}", keys.join(", ")));
    }
    found
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_spec_field_is_on_the_page() {
        let page = super::render().expect("renders");
        for heading in [
            "### `spec`",
            "### `spec.versions[]`",
            "### `spec.migration`",
            "### `status`",
        ] {
            assert!(page.contains(heading), "{heading}");
        }
        for field in [
            "`crdName`",
            "`requireNoTrafficFor`",
            "`preflightLead`",
            "`acceptLoss`",
        ] {
            assert!(page.contains(field), "{field}");
        }
    }
}
