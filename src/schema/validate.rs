//! An object checked against a version's structural schema as the apiserver checks it on
//! write and after conversion (`apiextensions-apiserver/pkg/apiserver/schema` and
//! kube-openapi's validator, v1.36): unknown fields are pruned (reported here, since pruning
//! loses them silently), `null` in a field that is not nullable and has no default is
//! dropped, defaults are applied, and then the value validations run: types (an integral
//! number such as `3.0` is an integer), the formats the apiserver knows, enums, patterns (Go's
//! regular expressions, see [`crate::re2`]), bounds, `multipleOf`, `required`, `nullable`,
//! `allOf` / `anyOf` / `oneOf` / `not`, and the uniqueness of `x-kubernetes-list-type: set`
//! and `map` lists. Not checked: CEL rules (`x-kubernetes-validations`), the metadata of
//! embedded resources, and the formats `uri`, `email`, `mac`, `isbn`, `isbn10`, `isbn13`,
//! `creditcard` and `duration` (accepted as given).

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

/// The message of a field the apiserver prunes.
const PRUNED: &str = "unknown field: the apiserver prunes it (its value is lost)";

/// The fields of the root that belong to the apiserver, not to the schema.
const RESERVED: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Every problem of `object` (a whole custom resource) against its version's root schema:
/// the fields the apiserver would prune, then what its validation rejects in the object as
/// it would store it (see [`served`]). `metadata`, `apiVersion` and `kind` are the
/// apiserver's, not the schema's.
pub fn validate(root: &Schema, object: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    if !object.is_object() {
        problems.push(problem("", "the object is not a JSON object"));
        return problems;
    }
    let served = stored(root, object, true, &mut problems);
    check(root, &served, "", true, &mut problems);
    problems
}

/// `object` as the apiserver stores and serves it: unknown fields pruned, `null` in fields
/// that are neither nullable nor defaulted dropped, defaults applied
/// (`structuralpruning.Prune`, `PruneNonNullableNullsWithoutDefaults`,
/// `structuraldefaulting.Default`).
pub fn served(root: &Schema, object: &Value) -> Value {
    stored(root, object, true, &mut Vec::new())
}

/// `value` pruned (what goes reported in `pruned`), its non-nullable nulls dropped and its
/// defaults applied, as the apiserver stores it.
fn stored(schema: &Schema, value: &Value, root: bool, pruned: &mut Vec<Problem>) -> Value {
    let mut stored = value.clone();
    prune(&mut stored, Some(schema), "", root, pruned);
    prune_nulls(&mut stored, Some(schema));
    default(&mut stored, Some(schema));
    stored
}

/// Every problem of a value (a field's, not a whole object's) against its schema, as for an
/// object: what pruning would drop, then what validation rejects once nulls are dropped and
/// defaults applied. Paths are relative to the value (`[0].name`, `name`).
pub fn validate_value(schema: &Schema, value: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    let served = stored(schema, value, false, &mut problems);
    check(schema, &served, "", false, &mut problems);
    problems
}

/// Whether `value` passes the value validations of `schema` (for the generator).
pub(super) fn fits(schema: &Schema, value: &Value) -> bool {
    let mut problems = Vec::new();
    check(schema, value, "", false, &mut problems);
    problems.is_empty()
}

fn problem(path: &str, message: impl Into<String>) -> Problem {
    Problem {
        path: path.to_owned(),
        message: message.into(),
    }
}

fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// Removes (and reports) what `schema` does not specify, as `structuralpruning.Prune` does:
/// below `x-kubernetes-preserve-unknown-fields` unknown fields stay, but the fields it
/// specifies are still pruned inside.
fn prune(value: &mut Value, schema: Option<&Schema>, path: &str, root: bool, problems: &mut Vec<Problem>) {
    let keeps_unknown = schema.is_some_and(|s| s.preserve_unknown_fields);
    match value {
        Value::Object(fields) => {
            let keeps_meta = root || schema.is_some_and(|s| s.embedded_resource);
            fields.retain(|name, child_value| {
                if keeps_meta && RESERVED.contains(&name.as_str()) {
                    return true;
                }
                let child_schema =
                    schema.and_then(|s| s.properties.get(name).or(s.additional_properties.as_deref()));
                match child_schema {
                    Some(child_schema) => {
                        prune(
                            child_value,
                            Some(child_schema),
                            &child(path, name),
                            false,
                            problems,
                        );
                        true
                    }
                    None if keeps_unknown => true,
                    None => {
                        problems.push(problem(&child(path, name), PRUNED));
                        false
                    }
                }
            });
        }
        Value::Array(items) => {
            let item_schema = schema.and_then(|s| s.items.as_deref());
            if keeps_unknown && item_schema.is_none() {
                return;
            }
            for (i, item) in items.iter_mut().enumerate() {
                prune(item, item_schema, &format!("{path}[{i}]"), false, problems);
            }
        }
        _ => {}
    }
}

/// The schema of an object's field: its property, or its maps' values.
fn field_schema<'a>(schema: Option<&'a Schema>, name: &str) -> Option<&'a Schema> {
    schema.and_then(|s| s.properties.get(name).or(s.additional_properties.as_deref()))
}

/// Drops `null` from fields that are not nullable and have no default (list items are left:
/// the validation rejects them).
fn prune_nulls(value: &mut Value, schema: Option<&Schema>) {
    match value {
        Value::Object(fields) => fields.retain(|name, child_value| {
            let child_schema = field_schema(schema, name);
            if child_value.is_null() && child_schema.is_some_and(|s| !s.nullable && s.default.is_none()) {
                return false;
            }
            prune_nulls(child_value, child_schema);
            true
        }),
        Value::Array(items) => {
            let item_schema = schema.and_then(|s| s.items.as_deref());
            for item in items {
                prune_nulls(item, item_schema);
            }
        }
        _ => {}
    }
}

/// Applies defaults: to a missing field, and to a `null` one that is not nullable.
fn default(value: &mut Value, schema: Option<&Schema>) {
    let Some(schema) = schema else { return };
    let non_nullable_null = |value: &Value, schema: &Schema| value.is_null() && !schema.nullable;
    match value {
        Value::Object(fields) => {
            for (name, property) in &schema.properties {
                let Some(default_value) = &property.default else {
                    continue;
                };
                if fields.get(name).is_none_or(|v| non_nullable_null(v, property)) {
                    fields.insert(name.clone(), default_value.clone());
                }
            }
            for (name, child_value) in fields.iter_mut() {
                if let Some(property) = schema.properties.get(name) {
                    default(child_value, Some(property));
                } else if let Some(values) = schema.additional_properties.as_deref() {
                    if non_nullable_null(child_value, values) {
                        *child_value = values.default.clone().unwrap_or(Value::Null);
                    }
                    default(child_value, Some(values));
                }
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = schema.items.as_deref() else {
                return;
            };
            for item in items {
                if non_nullable_null(item, item_schema) {
                    *item = item_schema.default.clone().unwrap_or(Value::Null);
                }
                default(item, Some(item_schema));
            }
        }
        _ => {}
    }
}

/// The value validations of `schema` on `value`. The root of an object leaves `apiVersion`,
/// `kind` and `metadata` alone.
fn check(schema: &Schema, value: &Value, path: &str, root: bool, problems: &mut Vec<Problem>) {
    let typed = schema.kind.is_some() || schema.int_or_string;
    if value.is_null() {
        // Only the type and the enum apply to null (kube-openapi's SchemaValidator).
        if typed && !schema.nullable {
            problems.push(problem(path, "Invalid value: null: the field is not nullable"));
        }
        if schema
            .enum_values
            .as_ref()
            .is_some_and(|allowed| !allowed.is_empty())
        {
            problems.push(problem(
                path,
                format!(
                    "Unsupported value: null: supported values: {}",
                    shown_enum(schema)
                ),
            ));
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
        && !allowed.is_empty()
        && !allowed.iter().any(|candidate| same_value(candidate, value))
    {
        problems.push(problem(
            path,
            format!(
                "Unsupported value: {}: supported values: {}",
                short(value),
                shown_enum(schema)
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
            check_list_type(schema, items, path, problems);
            if let Some(item_schema) = &schema.items {
                for (i, item) in items.iter().enumerate() {
                    check(item_schema, item, &format!("{path}[{i}]"), false, problems);
                }
            }
        }
        Value::Object(fields) => {
            let own = |name: &String| !(root && RESERVED.contains(&name.as_str()));
            let count = fields.keys().filter(|name| own(name)).count() as u64;
            bounds(
                path,
                count,
                schema.min_properties,
                schema.max_properties,
                "properties",
                problems,
            );
            for (name, child_value) in fields.iter().filter(|(name, _)| own(name)) {
                let child_path = child(path, name);
                if let Some(child_schema) = schema.properties.get(name) {
                    check(child_schema, child_value, &child_path, false, problems);
                } else if let Some(values) = &schema.additional_properties {
                    check(values, child_value, &child_path, false, problems);
                }
            }
            for name in schema.required.iter().filter(|name| own(name)) {
                if !fields.contains_key(name) {
                    problems.push(problem(&child(path, name), "Required value"));
                }
            }
        }
        _ => {}
    }
    check_junctors(schema, value, path, root, problems);
}

/// `allOf`, `anyOf`, `oneOf` and `not`: value validations on the same value, each passing
/// when it finds no problem.
fn check_junctors(schema: &Schema, value: &Value, path: &str, root: bool, problems: &mut Vec<Problem>) {
    let passes = |sub: &Schema| {
        let mut found = Vec::new();
        check(sub, value, path, root, &mut found);
        found
    };
    if !schema.all_of.is_empty() {
        let failures: Vec<Problem> = schema.all_of.iter().flat_map(passes).collect();
        if !failures.is_empty() {
            problems.extend(failures);
            problems.push(problem(
                path,
                "Invalid value: must validate all the schemas (allOf)",
            ));
        }
    }
    if !schema.any_of.is_empty() {
        let mut best: Option<Vec<Problem>> = None;
        for sub in &schema.any_of {
            let found = passes(sub);
            if found.is_empty() {
                best = None;
                break;
            }
            if best.as_ref().is_none_or(|b| found.len() < b.len()) {
                best = Some(found);
            }
        }
        if let Some(found) = best {
            problems.extend(found);
            problems.push(problem(
                path,
                "Invalid value: must validate at least one schema (anyOf)",
            ));
        }
    }
    if !schema.one_of.is_empty() {
        let valid = schema.one_of.iter().filter(|sub| passes(sub).is_empty()).count();
        if valid != 1 {
            problems.push(problem(
                path,
                format!(
                    "Invalid value: must validate one and only one schema (oneOf): {}",
                    if valid == 0 {
                        "found none valid".to_owned()
                    } else {
                        format!("found {valid} valid alternatives")
                    }
                ),
            ));
        }
    }
    if let Some(not) = &schema.not
        && passes(not).is_empty()
    {
        problems.push(problem(path, "Invalid value: must not validate the schema (not)"));
    }
}

/// Items of `x-kubernetes-list-type: set` are unique; so are the key tuples of `map` items
/// (`structurallisttype.ValidateListSetsAndMaps`).
fn check_list_type(schema: &Schema, items: &[Value], path: &str, problems: &mut Vec<Problem>) {
    let key_of = |item: &Value| -> Value {
        match schema.list_type.as_deref() {
            Some("map") => Value::Array(
                schema
                    .list_map_keys
                    .iter()
                    .map(|key| item.get(key).cloned().unwrap_or(Value::Null))
                    .collect(),
            ),
            _ => item.clone(),
        }
    };
    if !matches!(schema.list_type.as_deref(), Some("set" | "map")) {
        return;
    }
    // Compared as decoded: an integer 80 and a double 80.0 differ (recorded).
    let mut seen: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let key = key_of(item);
        if seen.contains(&key) {
            problems.push(problem(
                &format!("{path}[{i}]"),
                format!("Duplicate value: {}", short(&key)),
            ));
        } else {
            seen.push(key);
        }
    }
}

/// JSON values equal as the apiserver compares them: numbers by value (`1` is `1.0`).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

fn shown_enum(schema: &Schema) -> String {
    let allowed: Vec<String> = schema
        .enum_values
        .iter()
        .flatten()
        .map(Value::to_string)
        .collect();
    allowed.join(", ")
}

/// Largest magnitude of a number that a JSON decoder keeps as an exact integer (2^53 - 1):
/// kube-openapi counts a double as an integer only within it.
const MAX_EXACT_INTEGER: f64 = 9_007_199_254_740_991.0;

/// A number the apiserver decodes as an integer (an integer literal within int64), or as a
/// double that is integral and exact (`3.0`, `1e3`).
fn is_integer(number: &serde_json::Number) -> bool {
    number.is_i64()
        || number
            .as_f64()
            .is_some_and(|f| !number.is_u64() && f.fract() == 0.0 && f.abs() <= MAX_EXACT_INTEGER)
}

fn type_fits(schema: &Schema, value: &Value) -> bool {
    let integer = || matches!(value, Value::Number(n) if is_integer(n));
    if schema.int_or_string {
        return value.is_string() || integer();
    }
    match schema.kind.as_deref() {
        None => true,
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("boolean") => value.is_boolean(),
        Some("integer") => integer(),
        Some("number") => value.is_number(),
        Some(_) => true,
    }
}

fn check_string(schema: &Schema, text: &str, path: &str, problems: &mut Vec<Problem>) {
    let shown = || short(&Value::String(text.to_owned()));
    let length = text.chars().count() as u64;
    // As kube-openapi's string validator: the first failure of length, then pattern.
    if let Some(max) = schema.max_length
        && length > max
    {
        problems.push(problem(
            path,
            format!("Too long: may not be more than {max} characters"),
        ));
    } else if let Some(min) = schema.min_length
        && length < min
    {
        problems.push(problem(
            path,
            format!(
                "Invalid value: {}: should be at least {min} characters long",
                shown()
            ),
        ));
    } else if let Some(pattern) = &schema.pattern
        && let Ok(regex) = crate::re2::compile(pattern)
        && !regex.is_match(text)
    {
        problems.push(problem(
            path,
            format!("Invalid value: {}: should match '{pattern}'", shown()),
        ));
    }
    if let Some(format) = &schema.format
        && !format_fits(format, text)
    {
        problems.push(problem(
            path,
            format!("Invalid value: {}: must be of format {format}", shown()),
        ));
    }
}

/// The string formats of the apiserver's registry (kube-openapi `strfmt.Default`, names
/// compared without `-`) checked here, each as the apiserver's own checker; other formats
/// pass.
fn format_fits(format: &str, text: &str) -> bool {
    let matches = |pattern: &str| crate::re2::compile(pattern).is_ok_and(|compiled| compiled.is_match(text));
    match format.replace('-', "").as_str() {
        "datetime" => is_date_time(text),
        "date" => is_date(text),
        "uuid" => matches(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"),
        "uuid3" => matches(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$"),
        "uuid4" => matches(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"),
        "uuid5" => matches(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"),
        // `netutils.ParseIPSloppy` and a dot: leading zeros are allowed.
        "ipv4" => text.contains('.') && (sloppy_ipv4(text).is_some() || sloppy_ipv6(text)),
        // `net.ParseIP` and a colon.
        "ipv6" => text.contains(':') && text.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(text),
        "byte" => {
            matches(r"^(?:[A-Za-z0-9+\/]{4})*(?:[A-Za-z0-9+\/]{2}==|[A-Za-z0-9+\/]{3}=|[A-Za-z0-9+\/]{4})$")
        }
        "hexcolor" => matches(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"),
        "rgbcolor" => matches(
            r"^rgb\(\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*\)$",
        ),
        "ssn" => text.len() == 11 && matches(r"^\d{3}[- ]?\d{2}[- ]?\d{4}$"),
        "bsonobjectid" => text.len() == 24 && text.bytes().all(|b| b.is_ascii_hexdigit()),
        "hostname" => {
            matches(
                r"^([a-zA-Z0-9\p{S}\p{L}]((-?[a-zA-Z0-9\p{S}\p{L}]{0,62})?)|([a-zA-Z0-9\p{S}\p{L}](([a-zA-Z0-9-\p{S}\p{L}]{0,61}[a-zA-Z0-9\p{S}\p{L}])?)(\.)){1,}([a-zA-Z\p{L}]){2,63})$",
            ) && text.len() <= 255
                && text.split('.').all(|label| label.len() <= 63)
        }
        "k8sshortname" => text.len() <= 63 && matches(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        "k8slongname" => {
            text.len() <= 253 && matches(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        }
        _ => true,
    }
}

/// `strfmt.IsDate`: Go's `time.Parse("2006-01-02", ...)`.
fn is_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| bytes[range.clone()].iter().all(u8::is_ascii_digit);
    if bytes.len() != 10
        || bytes[4] != b'-'
        || bytes[7] != b'-'
        || !digits(0..4)
        || !digits(5..7)
        || !digits(8..10)
    {
        return false;
    }
    let number = |range: std::ops::Range<usize>| text[range].parse::<i16>().unwrap_or(-1);
    let (year, month, day) = (number(0..4), number(5..7), number(8..10));
    (1..=12).contains(&month) && jiff::civil::Date::new(year, month as i8, day as i8).is_ok()
}

/// `strfmt.IsDateTime`, exactly: split the lower-cased text at every `t`; the first part is a
/// date, the second matches `^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$`
/// (an optional fraction after any one character, then `z` or a required offset), with
/// `hh <= 23`, `mm <= 59`, `ss <= 59` (compared as text; the offset is not range-checked).
fn is_date_time(text: &str) -> bool {
    if text.len() < 4 {
        return false;
    }
    let lower = go_to_lower(text);
    let parts: Vec<&str> = lower.split('t').collect();
    parts.len() >= 2 && is_date(parts[0]) && is_time_of_date_time(parts[1])
}

/// The time part of [`is_date_time`].
fn is_time_of_date_time(text: &str) -> bool {
    let two_digits = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    let (Some(hours), Some(minutes), Some(seconds)) = (text.get(0..2), text.get(3..5), text.get(6..8)) else {
        return false;
    };
    if !(two_digits(hours) && two_digits(minutes) && two_digits(seconds))
        || text.as_bytes()[2] != b':'
        || text.as_bytes()[5] != b':'
        || !(hours <= "23" && minutes <= "59" && seconds <= "59")
    {
        return false;
    }
    let is_offset = |rest: &str| {
        rest == "z"
            || (rest.len() == 6
                && matches!(rest.as_bytes()[0], b'+' | b'-')
                && two_digits(&rest[1..3])
                && rest.as_bytes()[3] == b':'
                && two_digits(&rest[4..6]))
    };
    let rest = &text[8..];
    if is_offset(rest) {
        return true;
    }
    // A fraction: any one character but a newline, then digits (as many as there are: an
    // offset starts with none of them).
    let mut chars = rest.chars();
    match chars.next() {
        Some(c) if c != '\n' => {
            let after = chars.as_str();
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            digits > 0 && is_offset(&after[digits..])
        }
        _ => false,
    }
}

/// Go's `strings.ToLower` for what matters here (ASCII letters; other characters are kept,
/// which changes no answer: only digits, `:`, `.`, `+`, `-`, `t` and `z` can match).
fn go_to_lower(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii() { c.to_ascii_lowercase() } else { c })
        .collect()
}

/// An IPv4 address as Go before 1.17 (`ParseIPSloppy`): four decimal parts up to 255,
/// leading zeros allowed.
fn sloppy_ipv4(text: &str) -> Option<[u8; 4]> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (octet, part) in octets.iter_mut().zip(&parts) {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let value = part.trim_start_matches('0');
        *octet = if value.is_empty() { 0 } else { value.parse().ok()? };
    }
    Some(octets)
}

/// An IPv6 address whose embedded IPv4 part may have leading zeros (`ParseIPSloppy`).
fn sloppy_ipv6(text: &str) -> bool {
    let Some((head, last)) = text.rsplit_once(':') else {
        return false;
    };
    match sloppy_ipv4(last) {
        Some([a, b, c, d]) => format!("{head}:{a}.{b}.{c}.{d}")
            .parse::<std::net::Ipv6Addr>()
            .is_ok(),
        None => text.parse::<std::net::Ipv6Addr>().is_ok(),
    }
}

/// `netutils.ParseCIDRSloppy`: an address (leading zeros allowed in IPv4) and a prefix
/// length within its size.
fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(bits) = prefix.parse::<u8>() else {
        return false;
    };
    if prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    if sloppy_ipv4(address).is_some() {
        bits <= 32
    } else {
        (sloppy_ipv6(address) || address.parse::<std::net::Ipv6Addr>().is_ok()) && bits <= 128
    }
}

fn check_number(schema: &Schema, number: &serde_json::Number, path: &str, problems: &mut Vec<Problem>) {
    let Some(value) = number.as_f64() else { return };
    // The range of the format (or of int64 for an integer), as kube-openapi checks it.
    let integer_type = schema.kind.as_deref() == Some("integer") || schema.int_or_string;
    let as_integer = number
        .as_i64()
        .or_else(|| is_integer(number).then_some(value as i64));
    let out_of_range = match (integer_type, schema.format.as_deref()) {
        (true, Some("int32")) => as_integer.is_none_or(|i| i32::try_from(i).is_err()),
        (false, Some("float")) => value.abs() > f32::MAX as f64,
        _ => false,
    };
    if out_of_range {
        problems.push(problem(
            path,
            format!(
                "Invalid value: {number}: must be of type {} with format {}",
                if integer_type { "integer" } else { "number" },
                schema
                    .format
                    .as_deref()
                    .unwrap_or(if integer_type { "int64" } else { "double" })
            ),
        ));
    }
    if let Some(factor) = schema.multiple_of
        && !is_multiple(number, factor)
    {
        problems.push(problem(
            path,
            format!("Invalid value: {number}: should be a multiple of {factor}"),
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
}

/// `multipleOf` as kube-openapi checks it: an integer against the factor truncated to an
/// integer (so a fractional factor below 1 rejects every integer, as the apiserver does), a
/// double by whether the quotient is an integer.
fn is_multiple(number: &serde_json::Number, factor: f64) -> bool {
    if let Some(i) = number.as_i64() {
        let factor = factor.trunc();
        return factor >= 1.0 && factor <= i64::MAX as f64 && i % (factor as i64) == 0;
    }
    if factor <= 0.0 {
        return false;
    }
    let value = number.as_f64().unwrap_or(f64::NAN);
    let quotient = if factor < 1.0 {
        1.0 / factor * value
    } else {
        value / factor
    };
    is_json_integer(quotient)
}

/// `swag.IsFloat64AJSONInteger`: integral within 2^53, allowing a relative error of 1e-9.
fn is_json_integer(f: f64) -> bool {
    if !f.is_finite() || f.abs() > MAX_EXACT_INTEGER {
        return false;
    }
    let rounded = f.round();
    if f == rounded {
        return true;
    }
    if rounded == 0.0 {
        return false;
    }
    (f - rounded).abs() < 1e-9 * rounded.abs()
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
