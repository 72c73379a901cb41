//! An object checked against a version's structural schema as the apiserver checks it on
//! write and after conversion: unknown fields are pruned (reported here, since pruning loses
//! them silently), then types, formats it knows, enums, patterns, bounds and required fields
//! are validated (`apiextensions-apiserver/pkg/apiserver/schema`: pruning, then the OpenAPI
//! validator). Not checked: CEL rules (`x-kubernetes-validations`) and list-type uniqueness.

use serde_json::Value;

use super::Schema;

/// One way an object does not fit a schema: the field path (`spec.port`,
/// `spec.items[2].name`) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem of `object` (a whole custom resource) against its version's root schema.
/// `metadata`, `apiVersion` and `kind` are the apiserver's, not the schema's.
pub fn validate(root: &Schema, object: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    let Some(fields) = object.as_object() else {
        problems.push(problem("", "the object is not a JSON object"));
        return problems;
    };
    for (name, value) in fields {
        if matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match root.properties.get(name) {
            Some(schema) => check(schema, value, name, &mut problems),
            None if root.preserve_unknown_fields => {}
            None => problems.push(problem(
                name,
                "unknown field: the apiserver prunes it (its value is lost)",
            )),
        }
    }
    for name in &root.required {
        if !matches!(name.as_str(), "apiVersion" | "kind" | "metadata") && !fields.contains_key(name) {
            problems.push(problem(name, "Required value"));
        }
    }
    problems
}

fn problem(path: &str, message: impl Into<String>) -> Problem {
    Problem {
        path: path.to_owned(),
        message: message.into(),
    }
}

fn check(schema: &Schema, value: &Value, path: &str, problems: &mut Vec<Problem>) {
    if value.is_null() {
        if !schema.nullable {
            problems.push(problem(path, "Invalid value: null: the field is not nullable"));
        }
        return;
    }
    if !type_fits(schema, value) {
        problems.push(problem(
            path,
            format!(
                "Invalid value: {}: must be of type {}",
                short(value),
                if schema.int_or_string {
                    "integer or string"
                } else {
                    schema.kind.as_deref().unwrap_or("any")
                }
            ),
        ));
        return;
    }
    if let Some(allowed) = &schema.enum_values
        && !allowed.contains(value)
    {
        let allowed: Vec<String> = allowed.iter().map(Value::to_string).collect();
        problems.push(problem(
            path,
            format!(
                "Unsupported value: {}: supported values: {}",
                short(value),
                allowed.join(", ")
            ),
        ));
    }
    match value {
        Value::String(text) => check_string(schema, text, path, problems),
        Value::Number(number) => check_number(schema, number, path, problems),
        Value::Array(items) => {
            bounds(
                path,
                items.len() as u64,
                schema.min_items,
                schema.max_items,
                "items",
                problems,
            );
            if let Some(item_schema) = &schema.items {
                for (i, item) in items.iter().enumerate() {
                    check(item_schema, item, &format!("{path}[{i}]"), problems);
                }
            }
        }
        Value::Object(fields) => {
            bounds(
                path,
                fields.len() as u64,
                schema.min_properties,
                schema.max_properties,
                "properties",
                problems,
            );
            for (name, child) in fields {
                let child_path = format!("{path}.{name}");
                if let Some(child_schema) = schema.properties.get(name) {
                    check(child_schema, child, &child_path, problems);
                } else if let Some(values) = &schema.additional_properties {
                    check(values, child, &child_path, problems);
                } else if schema.embedded_resource
                    && matches!(name.as_str(), "apiVersion" | "kind" | "metadata")
                {
                } else if !schema.preserve_unknown_fields {
                    problems.push(problem(
                        &child_path,
                        "unknown field: the apiserver prunes it (its value is lost)",
                    ));
                }
            }
            for name in &schema.required {
                if !fields.contains_key(name) {
                    problems.push(problem(&format!("{path}.{name}"), "Required value"));
                }
            }
        }
        _ => {}
    }
}

fn type_fits(schema: &Schema, value: &Value) -> bool {
    if schema.int_or_string {
        return value.is_string() || value.as_i64().is_some() || value.as_u64().is_some();
    }
    match schema.kind.as_deref() {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("boolean") => value.is_boolean(),
        Some("integer") => value.as_i64().is_some() || value.as_u64().is_some(),
        Some("number") => value.is_number(),
        Some(_) => true,
    }
}

fn check_string(schema: &Schema, text: &str, path: &str, problems: &mut Vec<Problem>) {
    let length = text.chars().count() as u64;
    bounds(
        path,
        length,
        schema.min_length,
        schema.max_length,
        "characters",
        problems,
    );
    if let Some(pattern) = &schema.pattern
        && let Ok(regex) = regex::Regex::new(pattern)
        && !regex.is_match(text)
    {
        problems.push(problem(
            path,
            format!(
                "Invalid value: {}: should match '{pattern}'",
                short(&Value::String(text.to_owned()))
            ),
        ));
    }
    if let Some(format) = &schema.format
        && !format_fits(format, text)
    {
        problems.push(problem(
            path,
            format!(
                "Invalid value: {}: must be of format {format}",
                short(&Value::String(text.to_owned()))
            ),
        ));
    }
}

/// The formats of the apiserver's registry (kube-openapi `strfmt.Default`) that a string is
/// checked against here; others (`password`, `uri`, `email`, ...) are accepted as given.
fn format_fits(format: &str, text: &str) -> bool {
    match format {
        "date-time" | "datetime" => text.parse::<jiff::Timestamp>().is_ok(),
        "date" => text.len() == 10 && text.parse::<jiff::civil::Date>().is_ok(),
        "uuid" => {
            let hex = |part: &str, n: usize| part.len() == n && part.chars().all(|c| c.is_ascii_hexdigit());
            let parts: Vec<&str> = text.split('-').collect();
            parts.len() == 5 && [8, 4, 4, 4, 12].iter().zip(&parts).all(|(n, part)| hex(part, *n))
        }
        "ipv4" => text.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => text.parse::<std::net::Ipv6Addr>().is_ok(),
        "byte" => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(text).is_ok()
        }
        _ => true,
    }
}

fn check_number(schema: &Schema, number: &serde_json::Number, path: &str, problems: &mut Vec<Problem>) {
    let Some(value) = number.as_f64() else { return };
    if let Some(minimum) = schema.minimum
        && (value < minimum || (schema.exclusive_minimum && value == minimum))
    {
        let relation = if schema.exclusive_minimum {
            "greater than"
        } else {
            "greater than or equal to"
        };
        problems.push(problem(
            path,
            format!("Invalid value: {number}: should be {relation} {minimum}"),
        ));
    }
    if let Some(maximum) = schema.maximum
        && (value > maximum || (schema.exclusive_maximum && value == maximum))
    {
        let relation = if schema.exclusive_maximum {
            "less than"
        } else {
            "less than or equal to"
        };
        problems.push(problem(
            path,
            format!("Invalid value: {number}: should be {relation} {maximum}"),
        ));
    }
    let range = match schema.format.as_deref() {
        Some("int32") => Some((i32::MIN as f64, i32::MAX as f64)),
        Some("int64") => Some((i64::MIN as f64, i64::MAX as f64)),
        _ => None,
    };
    if let Some((low, high)) = range
        && (value < low || value > high)
    {
        problems.push(problem(
            path,
            format!(
                "Invalid value: {number}: must be of format {}",
                schema.format.as_deref().unwrap_or_default()
            ),
        ));
    }
}

fn bounds(
    path: &str,
    size: u64,
    min: Option<u64>,
    max: Option<u64>,
    what: &str,
    problems: &mut Vec<Problem>,
) {
    if let Some(min) = min
        && size < min
    {
        problems.push(problem(
            path,
            format!("Invalid value: {size}: should have at least {min} {what}"),
        ));
    }
    if let Some(max) = max
        && size > max
    {
        problems.push(problem(path, format!("Too long: may have at most {max} {what}")));
    }
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= 60 {
        return text;
    }
    format!("{}...", text.chars().take(60).collect::<String>())
}
