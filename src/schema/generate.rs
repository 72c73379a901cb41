//! Objects generated from a schema for `crd-lifecycle test`: every value fits the schema
//! (types, formats, enums, patterns, bounds, required fields), optional fields come and go,
//! and fields that keep unknown content get some. Seeded, so a run can be repeated.

use serde_json::{Map, Value, json};

use super::Schema;

/// A small seeded generator (SplitMix64): the same seed gives the same objects on every
/// machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: i64, high: i64) -> i64 {
        if high <= low {
            return low;
        }
        let span = (high as i128 - low as i128 + 1) as u128;
        (low as i128 + (self.next_u64() as u128 % span) as i128) as i64
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// One of `items` (not empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.next_u64() as usize % items.len()]
    }
}

/// Deepest nesting generated (a recursive schema cannot be, but a deep one is cut here).
const MAX_DEPTH: usize = 12;

/// The fields of an object for `root` (without apiVersion, kind and metadata), or why no
/// valid one could be made (a required field whose pattern no candidate matched).
pub fn generate(root: &Schema, rng: &mut Rng) -> Result<Map<String, Value>, String> {
    let mut schema = root.clone();
    for reserved in ["apiVersion", "kind", "metadata"] {
        schema.properties.remove(reserved);
        schema.required.retain(|name| name != reserved);
    }
    match value(&schema, rng, "", 0)? {
        Some(Value::Object(fields)) => Ok(fields),
        _ => Ok(Map::new()),
    }
}

/// Tries a value this many times before giving up on a schema whose `allOf`, `anyOf`,
/// `oneOf`, `not` or list uniqueness the first candidates miss.
const ATTEMPTS: usize = 50;

/// A value for one field's schema (for checking a type change's expressions on samples);
/// `None` when no value could be made.
pub fn generate_value(schema: &Schema, rng: &mut Rng) -> Option<Value> {
    value(schema, rng, "", 1).ok().flatten()
}

fn value(schema: &Schema, rng: &mut Rng, path: &str, depth: usize) -> Result<Option<Value>, String> {
    let constrained = !schema.all_of.is_empty()
        || !schema.any_of.is_empty()
        || !schema.one_of.is_empty()
        || schema.not.is_some()
        || matches!(schema.list_type.as_deref(), Some("set" | "map"));
    if !constrained {
        return candidate(schema, rng, path, depth);
    }
    for _ in 0..ATTEMPTS {
        if let Some(found) = candidate(schema, rng, path, depth)?
            && super::validate::fits(schema, &found)
        {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

fn candidate(schema: &Schema, rng: &mut Rng, path: &str, depth: usize) -> Result<Option<Value>, String> {
    // The apiserver refuses null for a field with an enum, nullable or not (recorded).
    if schema.nullable && schema.enum_values.is_none() && rng.chance(10) {
        return Ok(Some(Value::Null));
    }
    if let Some(allowed) = &schema.enum_values
        && !allowed.is_empty()
    {
        return Ok(Some(rng.pick(allowed).clone()));
    }
    if schema.int_or_string {
        return if rng.chance(50) {
            Ok(Some(json!(rng.between(0, 65535))))
        } else {
            string(schema, rng, path).map(|s| s.map(Value::String))
        };
    }
    Ok(match schema.kind.as_deref() {
        Some("string") => string(schema, rng, path)?.map(Value::String),
        Some("integer") => Some(json!(integer(schema, rng))),
        Some("number") => {
            let low = schema.minimum.unwrap_or(-1000.0);
            let high = schema.maximum.unwrap_or(low + 2000.0);
            let x = low + (rng.next_u64() % 10_000) as f64 / 10_000.0 * (high - low);
            let x = (x * 100.0).round() / 100.0;
            Some(json!(x.clamp(low, high)))
        }
        Some("boolean") => Some(Value::Bool(rng.chance(50))),
        Some("array") => {
            let low = schema.min_items.unwrap_or(0);
            let high = schema.max_items.unwrap_or(low + 3).min(low + 3);
            let count = rng.between(low as i64, high as i64);
            let mut items = Vec::new();
            if let Some(item) = &schema.items
                && depth < MAX_DEPTH
            {
                for i in 0..count {
                    match value(item, rng, &format!("{path}[{i}]"), depth + 1)? {
                        Some(v) => items.push(v),
                        None if (items.len() as u64) < low => {
                            return Err(format!("{path}[{i}]: no value fits its schema"));
                        }
                        None => {}
                    }
                }
            }
            Some(Value::Array(items))
        }
        Some("object") | None if depth < MAX_DEPTH => Some(object(schema, rng, path, depth)?),
        _ => None,
    })
}

fn object(schema: &Schema, rng: &mut Rng, path: &str, depth: usize) -> Result<Value, String> {
    let mut fields = Map::new();
    for (name, child) in &schema.properties {
        let required = schema.required.contains(name);
        if !required && !rng.chance(70) {
            continue;
        }
        let child_path = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        match value(child, rng, &child_path, depth + 1)? {
            Some(v) => {
                fields.insert(name.clone(), v);
            }
            None if required => return Err(format!("{child_path}: no value fits its schema")),
            None => {}
        }
    }
    if let Some(values) = &schema.additional_properties {
        for i in 0..rng.between(0, 2) {
            if let Some(v) = value(values, rng, &format!("{path}.key{i}"), depth + 1)? {
                fields.insert(format!("key{i}"), v);
            }
        }
    } else if schema.preserve_unknown_fields && rng.chance(50) {
        fields.insert("extra".to_owned(), json!({"kept": rng.between(0, 9), "as": "is"}));
    }
    Ok(Value::Object(fields))
}

fn integer(schema: &Schema, rng: &mut Rng) -> i64 {
    let (format_low, format_high) = match schema.format.as_deref() {
        Some("int32") => (i32::MIN as i64, i32::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    };
    let mut low = schema.minimum.map_or(-1000, |m| m.ceil() as i64).max(format_low);
    let mut high = schema
        .maximum
        .map_or(low.saturating_add(2000), |m| m.floor() as i64)
        .min(format_high);
    if schema.exclusive_minimum {
        low = low.saturating_add(1);
    }
    if schema.exclusive_maximum {
        high = high.saturating_sub(1);
    }
    // Edges now and then: bounds are where conversions break.
    match rng.between(0, 9) {
        0 => low,
        1 => high,
        _ => rng.between(low, high),
    }
}

const ALPHABETS: [&str; 4] = [
    "abcdefghijklmnopqrstuvwxyz",
    "0123456789",
    "abcdefghijklmnopqrstuvwxyz0123456789-",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 _.-é",
];

fn string(schema: &Schema, rng: &mut Rng, path: &str) -> Result<Option<String>, String> {
    if let Some(format) = &schema.format
        && let Some(text) = formatted(format, rng)
    {
        return Ok(Some(text));
    }
    let low = schema.min_length.unwrap_or(0);
    let high = schema.max_length.unwrap_or(low + 12).min(low + 12);
    let pattern = match &schema.pattern {
        Some(pattern) => match crate::re2::compile(pattern) {
            Ok(regex) => Some(regex),
            Err(_) => {
                return Err(format!(
                    "{path}: its pattern {pattern:?} cannot be used to generate values"
                ));
            }
        },
        None => None,
    };
    for attempt in 0..400 {
        let alphabet: Vec<char> = ALPHABETS[attempt % ALPHABETS.len()].chars().collect();
        let length = rng.between(low as i64, high as i64) as usize;
        let text: String = (0..length).map(|_| *rng.pick(&alphabet)).collect();
        if pattern.as_ref().is_none_or(|regex| regex.is_match(&text)) {
            return Ok(Some(text));
        }
    }
    Ok(None)
}

fn formatted(format: &str, rng: &mut Rng) -> Option<String> {
    Some(match format {
        "date-time" | "datetime" => format!(
            "20{:02}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            rng.between(20, 40),
            rng.between(1, 12),
            rng.between(1, 28),
            rng.between(0, 23),
            rng.between(0, 59),
            rng.between(0, 59)
        ),
        "date" => format!(
            "20{:02}-{:02}-{:02}",
            rng.between(20, 40),
            rng.between(1, 12),
            rng.between(1, 28)
        ),
        "uuid" => {
            let a = rng.next_u64();
            let b = rng.next_u64();
            format!(
                "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                a >> 32,
                (a >> 16) & 0xffff,
                a & 0xffff,
                b >> 48,
                b & 0xffff_ffff_ffff
            )
        }
        "ipv4" => format!(
            "10.{}.{}.{}",
            rng.between(0, 255),
            rng.between(0, 255),
            rng.between(1, 254)
        ),
        "byte" => {
            use base64::Engine;
            // At least one byte: the apiserver's `byte` refuses the empty string.
            let bytes: Vec<u8> = (0..rng.between(1, 8))
                .map(|_| rng.between(0, 255) as u8)
                .collect();
            base64::engine::general_purpose::STANDARD.encode(bytes)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::validate;

    #[test]
    fn generated_objects_fit_their_schema_and_repeat_with_the_seed() {
        let schema = Schema::parse(&json!({"type": "object", "properties": {"spec": {
        "type": "object", "required": ["port", "mode"],
        "properties": {
            "port": {"type": "string", "pattern": "^[0-9]{1,5}$"},
            "mode": {"type": "string", "enum": ["Always", "Never"]},
            "replicas": {"type": "integer", "format": "int32", "minimum": 0, "maximum": 10},
            "ratio": {"type": "number", "minimum": 0.5, "maximum": 1.5},
            "when": {"type": "string", "format": "date-time"},
            "id": {"type": "string", "format": "uuid"},
            "tags": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string", "minLength": 2, "maxLength": 4}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "either": {"x-kubernetes-int-or-string": true},
            "maybe": {"type": "string", "nullable": true},
            "level": {"type": "string", "nullable": true, "enum": ["low", "high"]},
            "choice": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                       "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
            "names": {"type": "array", "x-kubernetes-list-type": "set", "minItems": 2,
                      "items": {"type": "string", "enum": ["x", "y", "z"]}},
            "blob": {"type": "string", "format": "byte"}
        }}}}));
        let mut rng = Rng::new(7);
        for _ in 0..200 {
            let fields = generate(&schema, &mut rng).expect("generated");
            let object = Value::Object(fields);
            assert_eq!(validate(&schema, &object), Vec::new(), "{object}");
            if let Some(spec) = object.get("spec") {
                assert!(
                    spec["port"].is_string() && spec["mode"].is_string(),
                    "required: {spec}"
                );
            }
        }
        let again = |seed| generate(&schema, &mut Rng::new(seed)).expect("generated");
        assert_eq!(again(42), again(42));
        assert_ne!(again(42), again(43));
    }
}
