//! CEL expressions of `changed[]`: `self` is a field's value in one version, the result its
//! value in the other. Evaluated with kube-cel (cel-rust plus the Kubernetes extension
//! functions: strings such as `lowerAscii()`, lists, math), with nothing in scope but
//! `self`, and bounded in cost before they ever run: at most `MAX_SOURCE_BYTES` of source,
//! no comprehension (`map`, `filter`, `all`, `exists`) inside another, and none whose body
//! refers to `self`, so one evaluation takes time linear in the size of the value.

use std::collections::HashMap;
use std::sync::Arc;

use kube_cel::KubeCelExt;
use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr};
use kube_cel::cel::objects::{Key, Map};
use kube_cel::cel::{Context, Program, Value as CelValue};
use serde_json::{Number, Value};

/// Longest expression accepted (bytes).
pub const MAX_SOURCE_BYTES: usize = 1024;

/// A compiled, cost-bounded expression.
pub struct Expression {
    source: String,
    program: Program,
}

impl std::fmt::Debug for Expression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expression").field(&self.source).finish()
    }
}

impl Expression {
    /// Compiles `source`; the error says why it cannot run (syntax, a name other than
    /// `self`, or a cost that is not bounded).
    pub fn compile(source: &str) -> Result<Expression, String> {
        if source.trim().is_empty() {
            return Err("the expression is empty".to_owned());
        }
        if source.len() > MAX_SOURCE_BYTES {
            return Err(format!(
                "the expression is {} bytes long; at most {MAX_SOURCE_BYTES} are allowed",
                source.len()
            ));
        }
        let program = Program::compile(source).map_err(|e| format!("does not compile: {e}"))?;
        check(program.expression(), &mut Vec::new(), false)?;
        Ok(Expression {
            source: source.to_owned(),
            program,
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Evaluates with `self` bound to `value`; the result must be a JSON value.
    pub fn evaluate(&self, value: &Value) -> Result<Value, String> {
        let mut context = Context::default();
        context.register_all();
        context.add_variable_from_value("self", to_cel(value));
        let result = self.program.execute(&context).map_err(|e| e.to_string())?;
        to_json(&result)
    }
}

/// Walks the expression: only `self` and the variables of the enclosing comprehension are
/// in scope; comprehensions do not nest, and their bodies do not refer to `self`.
fn check(expr: &IdedExpr, bound: &mut Vec<String>, in_comprehension: bool) -> Result<(), String> {
    match &expr.expr {
        Expr::Ident(name) if name == "self" && in_comprehension => Err(
            "a comprehension's body may not refer to self (its cost would grow with the square of the value)"
                .to_owned(),
        ),
        Expr::Ident(name) if name == "self" || bound.contains(name) => Ok(()),
        Expr::Ident(name) => Err(format!("unknown name {name}: only self is available")),
        Expr::Comprehension(comprehension) => {
            if in_comprehension {
                return Err("a comprehension (map, filter, all, exists) may not contain another".to_owned());
            }
            check(&comprehension.iter_range, bound, false)?;
            let depth = bound.len();
            bound.push(comprehension.iter_var.clone());
            bound.extend(comprehension.iter_var2.clone());
            bound.push(comprehension.accu_var.clone());
            let result = [
                &comprehension.accu_init,
                &comprehension.loop_cond,
                &comprehension.loop_step,
                &comprehension.result,
            ]
            .into_iter()
            .try_for_each(|part| check(part, bound, true));
            bound.truncate(depth);
            result
        }
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                check(target, bound, in_comprehension)?;
            }
            call.args
                .iter()
                .try_for_each(|arg| check(arg, bound, in_comprehension))
        }
        Expr::List(list) => list
            .elements
            .iter()
            .try_for_each(|element| check(element, bound, in_comprehension)),
        Expr::Map(map) => map.entries.iter().try_for_each(|entry| match &entry.expr {
            EntryExpr::MapEntry(entry) => {
                check(&entry.key, bound, in_comprehension)?;
                check(&entry.value, bound, in_comprehension)
            }
            EntryExpr::StructField(field) => check(&field.value, bound, in_comprehension),
        }),
        Expr::Struct(_) => Err("message literals are not available: build a map instead".to_owned()),
        Expr::Select(select) => check(&select.operand, bound, in_comprehension),
        Expr::Literal(_) | Expr::Unspecified => Ok(()),
    }
}

/// A JSON value as CEL sees a CRD field: integers are `int` (`uint` only beyond `int`'s
/// range), other numbers `double`.
fn to_cel(value: &Value) -> CelValue {
    match value {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => CelValue::Int(i),
            (None, Some(u), _) => CelValue::UInt(u),
            (_, _, Some(f)) => CelValue::Float(f),
            _ => CelValue::Null,
        },
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(fields) => {
            let map: HashMap<Key, CelValue> = fields
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            CelValue::Map(Map { map: Arc::new(map) })
        }
    }
}

/// A CEL result as a JSON value: maps need string keys, doubles must be finite, and bytes,
/// timestamps, durations and types have no JSON form. Map keys come out sorted.
fn to_json(value: &CelValue) -> Result<Value, String> {
    Ok(match value {
        CelValue::Null => Value::Null,
        CelValue::Bool(b) => Value::Bool(*b),
        CelValue::Int(i) => Value::from(*i),
        CelValue::UInt(u) => Value::from(*u),
        CelValue::Float(f) => Number::from_f64(*f)
            .map(Value::Number)
            .ok_or_else(|| format!("the result {f} is not a JSON number"))?,
        CelValue::String(s) => Value::String(s.as_ref().clone()),
        CelValue::List(items) => Value::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        CelValue::Map(map) => {
            let mut entries = Vec::with_capacity(map.map.len());
            for (key, item) in map.map.iter() {
                let Key::String(key) = key else {
                    return Err(format!("the result has a map key {key:?} that is not a string"));
                };
                entries.push((key.as_ref().clone(), to_json(item)?));
            }
            // Stable output whatever the hash order.
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().collect())
        }
        other => return Err(format!("the result {other:?} has no JSON form")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(source: &str, value: Value) -> Result<Value, String> {
        Expression::compile(source)?.evaluate(&value)
    }

    #[test]
    fn type_changes_evaluate() {
        assert_eq!(eval("int(self)", json!("8080")), Ok(json!(8080)));
        assert_eq!(eval("string(self)", json!(8080)), Ok(json!("8080")));
        assert_eq!(eval("int(self)", json!("08080")), Ok(json!(8080)));
        assert_eq!(eval("[self]", json!("a")), Ok(json!(["a"])));
        assert_eq!(eval("self[0]", json!(["a", "b"])), Ok(json!("a")));
        assert_eq!(eval("{'value': self}", json!(3)), Ok(json!({"value": 3})));
        // Map results come out in key order, whatever the hash order.
        let map = eval("{'b': 1, 'c': 3, 'a': self}", json!(2)).expect("a map");
        assert_eq!(map.to_string(), r#"{"a":2,"b":1,"c":3}"#);
        assert_eq!(eval("self.lowerAscii()", json!("Always")), Ok(json!("always")));
        assert_eq!(
            eval("self.map(x, string(x))", json!([1, 2])),
            Ok(json!(["1", "2"]))
        );
        assert_eq!(eval("self * 2", json!(21)), Ok(json!(42)));
        assert!(eval("int(self)", json!("abc")).is_err());
    }

    #[test]
    fn only_self_and_bounded_cost() {
        let refused = |source: &str| Expression::compile(source).expect_err(source);
        assert!(refused("int(").contains("does not compile"));
        assert!(refused("other + 1").contains("only self"));
        assert!(refused("self.map(x, self)").contains("may not refer to self"));
        assert!(refused("self.map(x, self.map(y, y))").contains("may not contain another"));
        assert!(refused("self.all(x, [1].exists(y, y == x))").contains("may not contain another"));
        assert!(refused(&"1 + ".repeat(400)).contains("bytes long"));
        assert!(refused(" ").contains("empty"));
        assert!(Expression::compile("self.filter(x, x > 1).size()").is_ok());
    }

    #[test]
    fn results_without_a_json_form_are_errors() {
        assert!(eval("b'abc'", json!(null)).unwrap_err().contains("no JSON form"));
        assert!(eval("{1: 2}", json!(null)).unwrap_err().contains("not a string"));
        assert!(
            eval("1.0 / 0.0", json!(null))
                .unwrap_err()
                .contains("not a JSON number")
        );
    }
}
