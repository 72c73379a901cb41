//! CEL values as the evaluator holds them, and their JSON forms.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Number, Value as Json};

use super::meter::{Meter, Stop};

/// A CEL value. Lists and maps are shared (`Arc`): reading `self` or a variable never
/// copies, and an accumulator owned by a comprehension grows in place.
#[derive(Clone, Debug)]
pub(super) enum Value {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Double(f64),
    String(Arc<str>),
    List(Arc<Vec<Value>>),
    Map(Arc<BTreeMap<Key, Value>>),
}

/// A map key (CEL allows bool, int, uint and string keys).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Key {
    Bool(bool),
    Int(i64),
    UInt(u64),
    String(Arc<str>),
}

impl Key {
    pub(super) fn from_value(value: &Value) -> Result<Key, Stop> {
        Ok(match value {
            Value::Bool(b) => Key::Bool(*b),
            Value::Int(i) => Key::Int(*i),
            Value::UInt(u) => Key::UInt(*u),
            Value::String(s) => Key::String(s.clone()),
            other => return Err(Stop::error(format!("{} cannot be a map key", other.type_name()))),
        })
    }

    pub(super) fn to_value(&self) -> Value {
        match self {
            Key::Bool(b) => Value::Bool(*b),
            Key::Int(i) => Value::Int(*i),
            Key::UInt(u) => Value::UInt(*u),
            Key::String(s) => Value::String(s.clone()),
        }
    }
}

impl Value {
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::UInt(_) => "uint",
            Value::Double(_) => "double",
            Value::String(_) => "string",
            Value::List(_) => "list",
            Value::Map(_) => "map",
        }
    }

    /// A JSON value as CEL sees a CRD field: integers are `int` (`uint` only beyond `int`'s
    /// range), other numbers `double`. `units` grows by what writing it out as JSON costs.
    pub(super) fn from_json(value: &Json, units: &mut u64) -> Value {
        *units += 1;
        match value {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => Value::Int(i),
                (None, Some(u), _) => Value::UInt(u),
                (_, _, Some(f)) => Value::Double(f),
                _ => Value::Null,
            },
            Json::String(s) => {
                *units += Meter::bytes_units(s.len());
                Value::String(Arc::from(s.as_str()))
            }
            Json::Array(items) => Value::List(Arc::new(
                items.iter().map(|item| Value::from_json(item, units)).collect(),
            )),
            Json::Object(fields) => Value::Map(Arc::new(
                fields
                    .iter()
                    .map(|(k, v)| (Key::String(Arc::from(k.as_str())), Value::from_json(v, units)))
                    .collect(),
            )),
        }
    }

    /// The result as JSON: maps need string keys, doubles must be finite. Every value and
    /// every 10 bytes of string written is charged, so a small value that shares one list
    /// many times over cannot turn into a huge JSON document.
    pub(super) fn to_json(&self, meter: &mut Meter) -> Result<Json, Stop> {
        meter.charge(1)?;
        Ok(match self {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Int(i) => Json::from(*i),
            Value::UInt(u) => Json::from(*u),
            Value::Double(f) => Number::from_f64(*f)
                .map(Json::Number)
                .ok_or_else(|| Stop::error(format!("the result {f} is not a JSON number")))?,
            Value::String(s) => {
                meter.charge_bytes(s.len())?;
                Json::String(s.to_string())
            }
            Value::List(items) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items.iter() {
                    out.push(item.to_json(meter)?);
                }
                Json::Array(out)
            }
            Value::Map(map) => {
                let mut out = serde_json::Map::with_capacity(map.len());
                // BTreeMap order: the output is stable whatever the input order.
                for (key, item) in map.iter() {
                    let Key::String(key) = key else {
                        return Err(Stop::error(format!(
                            "the result has a map key {} that is not a string",
                            key.to_value().display()
                        )));
                    };
                    out.insert(key.to_string(), item.to_json(meter)?);
                }
                Json::Object(out)
            }
        })
    }

    /// A short rendering for messages.
    pub(super) fn display(&self) -> String {
        match self {
            Value::Null => "null".to_owned(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::UInt(u) => format!("{u}u"),
            Value::Double(f) => format!("{f:?}"),
            Value::String(s) if s.chars().count() > 40 => {
                format!("{:?}...", s.chars().take(40).collect::<String>())
            }
            Value::String(s) => format!("{s:?}"),
            Value::List(items) => format!("a list of {}", items.len()),
            Value::Map(map) => format!("a map of {}", map.len()),
        }
    }
}

/// CEL equality: numbers compare by value across int, uint and double; lists and maps
/// element by element. Every element compared is charged.
pub(super) fn equal(a: &Value, b: &Value, meter: &mut Meter) -> Result<bool, Stop> {
    meter.charge(1)?;
    Ok(match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::String(x), Value::String(y)) => {
            meter.charge_bytes(x.len().min(y.len()))?;
            x == y
        }
        (Value::List(x), Value::List(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            if Arc::ptr_eq(x, y) {
                return Ok(true);
            }
            for (a, b) in x.iter().zip(y.iter()) {
                if !equal(a, b, meter)? {
                    return Ok(false);
                }
            }
            true
        }
        (Value::Map(x), Value::Map(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            if Arc::ptr_eq(x, y) {
                return Ok(true);
            }
            for ((ka, va), (kb, vb)) in x.iter().zip(y.iter()) {
                if ka != kb || !equal(va, vb, meter)? {
                    return Ok(false);
                }
            }
            true
        }
        _ => match compare_numbers(a, b) {
            Some(ordering) => ordering == std::cmp::Ordering::Equal,
            None => false,
        },
    })
}

/// The order of two numbers of any numeric type; `None` when either is not a number (or NaN).
pub(super) fn compare_numbers(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    use std::cmp::Ordering;
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Some(x.cmp(y)),
        (Value::UInt(x), Value::UInt(y)) => Some(x.cmp(y)),
        (Value::Int(x), Value::UInt(y)) => Some(if *x < 0 {
            Ordering::Less
        } else {
            (*x as u64).cmp(y)
        }),
        (Value::UInt(x), Value::Int(y)) => Some(if *y < 0 {
            Ordering::Greater
        } else {
            x.cmp(&(*y as u64))
        }),
        (Value::Double(x), Value::Double(y)) => x.partial_cmp(y),
        (Value::Double(x), Value::Int(y)) => x.partial_cmp(&(*y as f64)),
        (Value::Int(x), Value::Double(y)) => (*x as f64).partial_cmp(y),
        (Value::Double(x), Value::UInt(y)) => x.partial_cmp(&(*y as f64)),
        (Value::UInt(x), Value::Double(y)) => (*x as f64).partial_cmp(y),
        _ => None,
    }
}
