//! The evaluator: walks the parsed expression, charging every step to a meter, and refusing
//! a string or list over its cap before allocating it.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cel::common::ast::{ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue, operators};

use crate::re2::Pattern;

use super::functions::is_math;
use super::meter::{Meter, Stop};
use super::value::{Key, Value, compare_numbers, equal};

type Result<T> = std::result::Result<T, Stop>;

pub(super) struct Evaluator<'a> {
    pub(super) meter: Meter,
    /// Variables in scope, innermost last: `self`, then comprehension variables.
    env: Vec<(&'a str, Value)>,
    patterns: &'a HashMap<u64, Arc<Pattern>>,
}

impl<'a> Evaluator<'a> {
    pub(super) fn new(meter: Meter, this: Value, patterns: &'a HashMap<u64, Arc<Pattern>>) -> Evaluator<'a> {
        Evaluator {
            meter,
            env: vec![("self", this)],
            patterns,
        }
    }

    pub(super) fn eval(&mut self, expr: &'a IdedExpr) -> Result<Value> {
        self.meter.charge(1)?;
        match &expr.expr {
            Expr::Literal(literal) => literal_value(literal),
            Expr::Ident(name) => self.lookup(name),
            Expr::Select(select) => {
                let operand = self.eval(&select.operand)?;
                let Value::Map(map) = &operand else {
                    return Err(Stop::error(format!(
                        "cannot select field {} of {}",
                        select.field,
                        operand.type_name()
                    )));
                };
                let key = Key::String(Arc::from(select.field.as_str()));
                if select.test {
                    return Ok(Value::Bool(map.contains_key(&key)));
                }
                map.get(&key)
                    .cloned()
                    .ok_or_else(|| Stop::error(format!("no such key: {}", select.field)))
            }
            Expr::List(list) => {
                self.meter.build_list(list.elements.len() as u128)?;
                let mut items = Vec::with_capacity(list.elements.len());
                for element in &list.elements {
                    items.push(self.eval(element)?);
                }
                Ok(Value::List(Arc::new(items)))
            }
            Expr::Map(map) => {
                self.meter.build_list(map.entries.len() as u128)?;
                let mut out = BTreeMap::new();
                for entry in &map.entries {
                    let EntryExpr::MapEntry(entry) = &entry.expr else {
                        return Err(Stop::error("message literals are not available"));
                    };
                    let key = Key::from_value(&self.eval(&entry.key)?)?;
                    let value = self.eval(&entry.value)?;
                    if out.insert(key, value).is_some() {
                        return Err(Stop::error("a map literal has the same key twice"));
                    }
                }
                Ok(Value::Map(Arc::new(out)))
            }
            Expr::Comprehension(comprehension) => self.comprehension(comprehension),
            Expr::Call(call) => {
                let target = call.target.as_deref();
                let args = &call.args;
                match call.func_name.as_str() {
                    operators::CONDITIONAL => match self.eval(&args[0])? {
                        Value::Bool(true) => self.eval(&args[1]),
                        Value::Bool(false) => self.eval(&args[2]),
                        other => Err(no_overload("_?_:_", &[&other])),
                    },
                    operators::LOGICAL_AND => self.logical(args, false),
                    operators::LOGICAL_OR => self.logical(args, true),
                    operators::NOT_STRICTLY_FALSE => match self.eval(&args[0]) {
                        Ok(Value::Bool(false)) => Ok(Value::Bool(false)),
                        Ok(_) | Err(Stop::Error(_)) => Ok(Value::Bool(true)),
                        Err(limit) => Err(limit),
                    },
                    operators::ADD if self.is_accumulator(&args[0]) => self.append(&args[0], &args[1]),
                    name => match target {
                        Some(target) if self.is_math(target) => {
                            let args = self.eval_all(args)?;
                            self.math(name, &args)
                        }
                        Some(target) => {
                            let receiver = self.eval(target)?;
                            let args = self.eval_all(args)?;
                            self.method(expr.id, name, receiver, &args)
                        }
                        None => {
                            let args = self.eval_all(args)?;
                            self.global(name, &args)
                        }
                    },
                }
            }
            Expr::Struct(_) => Err(Stop::error("message literals are not available")),
            Expr::Unspecified => Err(Stop::error("the expression is incomplete")),
        }
    }

    /// `math.f(...)`, unless a comprehension variable is called `math`.
    fn is_math(&self, target: &IdedExpr) -> bool {
        let shadowed = self.env.iter().any(|(name, _)| *name == "math");
        !shadowed && is_math(target, &[])
    }

    fn lookup(&self, name: &str) -> Result<Value> {
        self.env
            .iter()
            .rev()
            .find(|(bound, _)| *bound == name)
            .map(|(_, value)| value.clone())
            .ok_or_else(|| Stop::error(format!("unknown name {name}")))
    }

    fn eval_all(&mut self, args: &'a [IdedExpr]) -> Result<Vec<Value>> {
        args.iter().map(|arg| self.eval(arg)).collect()
    }

    /// `&&` and `||` as CEL has them: commutative over errors (`false && error` is false,
    /// `true || error` is true), never over a limit.
    fn logical(&mut self, args: &'a [IdedExpr], or: bool) -> Result<Value> {
        let decisive = or;
        let left = self.eval(&args[0]);
        if let Ok(Value::Bool(b)) = &left
            && *b == decisive
        {
            return Ok(Value::Bool(decisive));
        }
        if let Err(Stop::Limit(_)) = &left {
            return left;
        }
        let right = self.eval(&args[1]);
        match (left, right) {
            (_, Ok(Value::Bool(b))) if b == decisive => Ok(Value::Bool(decisive)),
            (_, Err(limit @ Stop::Limit(_))) => Err(limit),
            (Err(error), _) | (_, Err(error)) => Err(error),
            (Ok(Value::Bool(_)), Ok(Value::Bool(_))) => Ok(Value::Bool(!decisive)),
            (Ok(l), Ok(r)) => Err(no_overload(if or { "_||_" } else { "_&&_" }, &[&l, &r])),
        }
    }

    /// The accumulator of the innermost comprehension (the parser names it `@result`; an
    /// expression cannot spell that name).
    fn is_accumulator(&self, expr: &IdedExpr) -> bool {
        matches!(&expr.expr, Expr::Ident(name) if name.starts_with('@'))
    }

    /// `@result + [...]`, the step of `map` and `filter`: appends in place. The
    /// comprehension owns the accumulator, so this is linear where copying it each step
    /// would be quadratic.
    fn append(&mut self, accumulator: &'a IdedExpr, items: &'a IdedExpr) -> Result<Value> {
        let Expr::Ident(name) = &accumulator.expr else {
            unreachable!("is_accumulator checked the shape");
        };
        let items = self.eval(items)?;
        let slot = self
            .env
            .iter_mut()
            .rev()
            .find(|(bound, _)| bound == name)
            .ok_or_else(|| Stop::error(format!("unknown name {name}")))?;
        let current = std::mem::replace(&mut slot.1, Value::Null);
        match (current, items) {
            (Value::List(mut list), Value::List(items)) => {
                let total = list.len() + items.len();
                if total > super::meter::MAX_LIST_ELEMENTS {
                    self.meter.build_list(total as u128)?;
                }
                if Arc::get_mut(&mut list).is_none() {
                    // Shared elsewhere (the step kept a copy): the copy is paid for.
                    self.meter.charge_elements(list.len())?;
                }
                self.meter.charge_elements(items.len())?;
                Arc::make_mut(&mut list).extend(items.iter().cloned());
                Ok(Value::List(list))
            }
            (current, items) => self.add(current, items),
        }
    }

    fn comprehension(&mut self, comprehension: &'a ComprehensionExpr) -> Result<Value> {
        let range = self.eval(&comprehension.iter_range)?;
        let pairs: Vec<(Value, Value)> = match &range {
            Value::List(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| (Value::Int(i as i64), item.clone()))
                .collect(),
            Value::Map(map) => map.iter().map(|(k, v)| (k.to_value(), v.clone())).collect(),
            other => return Err(no_overload("comprehension", &[other])),
        };
        self.meter.charge_elements(pairs.len())?;
        let accumulator = self.eval(&comprehension.accu_init)?;
        let depth = self.env.len();
        self.env.push((&comprehension.accu_var, accumulator));
        self.env.push((&comprehension.iter_var, Value::Null));
        if let Some(second) = &comprehension.iter_var2 {
            self.env.push((second, Value::Null));
        }
        let outcome = self.run_loop(comprehension, pairs, range, depth);
        self.env.truncate(depth);
        outcome
    }

    fn run_loop(
        &mut self,
        comprehension: &'a ComprehensionExpr,
        pairs: Vec<(Value, Value)>,
        range: Value,
        depth: usize,
    ) -> Result<Value> {
        let two = comprehension.iter_var2.is_some();
        for (first, second) in pairs {
            self.meter.charge(1)?;
            match (two, &range) {
                (true, _) => {
                    self.env[depth + 1].1 = first;
                    self.env[depth + 2].1 = second;
                }
                (false, Value::List(_)) => self.env[depth + 1].1 = second,
                (false, _) => self.env[depth + 1].1 = first,
            }
            match self.eval(&comprehension.loop_cond)? {
                Value::Bool(false) => break,
                Value::Bool(true) => {}
                other => return Err(no_overload("loop condition", &[&other])),
            }
            let next = self.eval(&comprehension.loop_step)?;
            self.env[depth].1 = next;
        }
        self.eval(&comprehension.result)
    }

    fn add(&mut self, left: Value, right: Value) -> Result<Value> {
        Ok(match (left, right) {
            (Value::Int(a), Value::Int(b)) => Value::Int(a.checked_add(b).ok_or_else(overflow)?),
            (Value::UInt(a), Value::UInt(b)) => Value::UInt(a.checked_add(b).ok_or_else(overflow)?),
            (Value::Double(a), Value::Double(b)) => Value::Double(a + b),
            (Value::String(a), Value::String(b)) => {
                self.meter.build_string(a.len() as u128 + b.len() as u128)?;
                let mut joined = String::with_capacity(a.len() + b.len());
                joined.push_str(&a);
                joined.push_str(&b);
                Value::String(Arc::from(joined))
            }
            (Value::List(a), Value::List(b)) => {
                self.meter.build_list(a.len() as u128 + b.len() as u128)?;
                let mut joined = Vec::with_capacity(a.len() + b.len());
                joined.extend(a.iter().cloned());
                joined.extend(b.iter().cloned());
                Value::List(Arc::new(joined))
            }
            (a, b) => return Err(no_overload("_+_", &[&a, &b])),
        })
    }

    fn global(&mut self, name: &str, args: &[Value]) -> Result<Value> {
        let a = |i: usize| &args[i];
        match (name, args.len()) {
            (operators::ADD, 2) => self.add(a(0).clone(), a(1).clone()),
            (operators::SUBSTRACT | operators::MULTIPLY | operators::DIVIDE | operators::MODULO, 2) => {
                arithmetic(name, a(0), a(1))
            }
            (operators::NEGATE, 1) => match a(0) {
                Value::Int(i) => Ok(Value::Int(i.checked_neg().ok_or_else(overflow)?)),
                Value::Double(d) => Ok(Value::Double(-d)),
                other => Err(no_overload("-_", &[other])),
            },
            (operators::LOGICAL_NOT, 1) => match a(0) {
                Value::Bool(b) => Ok(Value::Bool(!b)),
                other => Err(no_overload("!_", &[other])),
            },
            (operators::EQUALS, 2) => Ok(Value::Bool(equal(a(0), a(1), &mut self.meter)?)),
            (operators::NOT_EQUALS, 2) => Ok(Value::Bool(!equal(a(0), a(1), &mut self.meter)?)),
            (
                operators::LESS | operators::LESS_EQUALS | operators::GREATER | operators::GREATER_EQUALS,
                2,
            ) => {
                let ordering = self.compare(name, a(0), a(1))?;
                Ok(Value::Bool(match name {
                    operators::LESS => ordering == Ordering::Less,
                    operators::LESS_EQUALS => ordering != Ordering::Greater,
                    operators::GREATER => ordering == Ordering::Greater,
                    _ => ordering != Ordering::Less,
                }))
            }
            (operators::INDEX, 2) => index(a(0), a(1)),
            (operators::IN, 2) => match a(1) {
                Value::List(items) => {
                    for item in items.iter() {
                        if equal(a(0), item, &mut self.meter)? {
                            return Ok(Value::Bool(true));
                        }
                    }
                    Ok(Value::Bool(false))
                }
                Value::Map(map) => Ok(Value::Bool(
                    Key::from_value(a(0)).is_ok_and(|key| map.contains_key(&key)),
                )),
                other => Err(no_overload("in", &[a(0), other])),
            },
            ("size", 1) => self.size(a(0)),
            ("dyn", 1) => Ok(a(0).clone()),
            ("int", 1) => to_int(a(0)),
            ("uint", 1) => to_uint(a(0)),
            ("double", 1) => to_double(a(0)),
            ("bool", 1) => to_bool(a(0)),
            ("string", 1) => {
                let text = match a(0) {
                    Value::String(s) => return Ok(Value::String(s.clone())),
                    Value::Int(i) => i.to_string(),
                    Value::UInt(u) => u.to_string(),
                    Value::Double(d) => d.to_string(),
                    Value::Bool(b) => b.to_string(),
                    other => return Err(no_overload("string", &[other])),
                };
                Ok(Value::String(Arc::from(text)))
            }
            _ => Err(Stop::error(format!("unknown function {name}/{}", args.len()))),
        }
    }

    fn size(&mut self, value: &Value) -> Result<Value> {
        Ok(Value::Int(match value {
            Value::String(s) => {
                self.meter.charge_bytes(s.len())?;
                s.chars().count() as i64
            }
            Value::List(items) => items.len() as i64,
            Value::Map(map) => map.len() as i64,
            other => return Err(no_overload("size", &[other])),
        }))
    }

    fn compare(&mut self, name: &str, a: &Value, b: &Value) -> Result<Ordering> {
        match (a, b) {
            (Value::String(x), Value::String(y)) => {
                self.meter.charge_bytes(x.len().min(y.len()))?;
                Ok(x.cmp(y))
            }
            (Value::Bool(x), Value::Bool(y)) => Ok(x.cmp(y)),
            _ => compare_numbers(a, b).ok_or_else(|| no_overload(name, &[a, b])),
        }
    }

    fn math(&mut self, name: &str, args: &[Value]) -> Result<Value> {
        match name {
            "greatest" | "least" => {
                let values: Vec<Value> = match args {
                    [Value::List(items)] => items.to_vec(),
                    _ => args.to_vec(),
                };
                self.meter.charge_elements(values.len())?;
                self.extreme(&format!("math.{name}"), &values, name == "greatest")
            }
            "abs" => match &args[0] {
                Value::Int(i) => Ok(Value::Int(i.checked_abs().ok_or_else(overflow)?)),
                Value::UInt(u) => Ok(Value::UInt(*u)),
                Value::Double(d) => Ok(Value::Double(d.abs())),
                other => Err(no_overload("math.abs", &[other])),
            },
            "ceil" | "floor" | "round" => match &args[0] {
                Value::Double(d) => Ok(Value::Double(match name {
                    "ceil" => d.ceil(),
                    "floor" => d.floor(),
                    _ => d.round(),
                })),
                other => Err(no_overload(&format!("math.{name}"), &[other])),
            },
            _ => Err(Stop::error(format!("unknown function math.{name}"))),
        }
    }

    fn extreme(&mut self, name: &str, values: &[Value], greatest: bool) -> Result<Value> {
        let mut best: Option<&Value> = None;
        for value in values {
            best = Some(match best {
                None => value,
                Some(current) => {
                    let ordering = self.compare(name, value, current)?;
                    if (greatest && ordering == Ordering::Greater)
                        || (!greatest && ordering == Ordering::Less)
                    {
                        value
                    } else {
                        current
                    }
                }
            });
        }
        best.cloned()
            .ok_or_else(|| Stop::error(format!("{name} of an empty list")))
    }

    fn method(&mut self, id: u64, name: &str, receiver: Value, args: &[Value]) -> Result<Value> {
        match (&receiver, name) {
            (_, "size") => self.size(&receiver),
            (Value::String(s), _) => self.string_method(id, name, s, args),
            (Value::List(items), _) => self.list_method(name, items, args),
            _ => Err(no_overload(name, &[&receiver])),
        }
    }

    fn string_method(&mut self, id: u64, name: &str, s: &Arc<str>, args: &[Value]) -> Result<Value> {
        let text = |i: usize| match args.get(i) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(no_overload(name, &[other])),
            None => Err(Stop::error(format!("{name}: missing argument"))),
        };
        let int = |i: usize| match args.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            Some(other) => Err(no_overload(name, &[other])),
            None => Err(Stop::error(format!("{name}: missing argument"))),
        };
        // Scanning the receiver is paid for once per call, as cel-go does; `contains` and
        // `matches` cost the product of the receiver's and the argument's sizes (cel-go's
        // `runtimecost.go`), charged before they run.
        if !matches!(name, "contains" | "matches") {
            self.meter.charge_bytes(s.len())?;
        }
        let string = |value: String| Value::String(Arc::from(value));
        Ok(match name {
            "contains" => {
                let needle = text(0)?;
                let (haystack_units, needle_units) =
                    (Meter::bytes_units(s.len()), Meter::bytes_units(needle.len()));
                self.meter
                    .charge(haystack_units.max(1).saturating_mul(needle_units.max(1)))?;
                Value::Bool(s.contains(&*needle))
            }
            "startsWith" => Value::Bool(s.starts_with(&*text(0)?)),
            "endsWith" => Value::Bool(s.ends_with(&*text(0)?)),
            "matches" => {
                let pattern = self
                    .patterns
                    .get(&id)
                    .ok_or_else(|| Stop::error("matches takes a string literal as its pattern"))?;
                self.meter
                    .charge(Meter::matches_units(s.len(), pattern.states()))?;
                Value::Bool(pattern.is_match(s))
            }
            "lowerAscii" => {
                self.meter.build_string(s.len() as u128)?;
                string(s.to_ascii_lowercase())
            }
            "upperAscii" => {
                self.meter.build_string(s.len() as u128)?;
                string(s.to_ascii_uppercase())
            }
            "trim" => Value::String(Arc::from(s.trim())),
            "replace" => {
                let (from, to) = (text(0)?, text(1)?);
                let limit = if args.len() == 3 { int(2)? } else { -1 };
                let occurrences = if from.is_empty() {
                    s.chars().count() as u128 + 1
                } else {
                    s.matches(&*from).count() as u128
                };
                let replaced = if limit < 0 {
                    occurrences
                } else {
                    occurrences.min(limit as u128)
                };
                let bytes = s.len() as u128 + replaced * to.len() as u128 - replaced * from.len() as u128;
                self.meter.build_string(bytes)?;
                string(if limit < 0 {
                    s.replace(&*from, &to)
                } else {
                    s.replacen(&*from, &to, limit as usize)
                })
            }
            "split" => {
                let separator = text(0)?;
                let limit = if args.len() == 2 { int(1)? } else { -1 };
                if limit == 0 {
                    return Ok(Value::List(Arc::new(Vec::new())));
                }
                let pieces = if separator.is_empty() {
                    s.chars().count() as u128
                } else {
                    s.matches(&*separator).count() as u128 + 1
                };
                let pieces = if limit < 0 {
                    pieces
                } else {
                    pieces.min(limit as u128)
                };
                self.meter.build_list(pieces)?;
                let parts: Vec<Value> = match (separator.is_empty(), limit < 0) {
                    (true, _) => {
                        let chars: Vec<char> = s.chars().collect();
                        let keep = pieces as usize;
                        let mut parts: Vec<Value> = chars[..keep.saturating_sub(1)]
                            .iter()
                            .map(|c| string(c.to_string()))
                            .collect();
                        if keep > 0 {
                            parts.push(string(chars[keep - 1..].iter().collect()));
                        }
                        parts
                    }
                    (false, true) => s
                        .split(&*separator)
                        .map(|p| Value::String(Arc::from(p)))
                        .collect(),
                    (false, false) => s
                        .splitn(limit as usize, &*separator)
                        .map(|p| Value::String(Arc::from(p)))
                        .collect(),
                };
                Value::List(Arc::new(parts))
            }
            "substring" => {
                let chars: Vec<(usize, char)> = s.char_indices().collect();
                let start = int(0)?;
                let end = if args.len() == 2 {
                    int(1)?
                } else {
                    chars.len() as i64
                };
                if start < 0 || end < start || end as usize > chars.len() {
                    return Err(Stop::error(format!(
                        "substring({start}, {end}) is out of range for a string of {} characters",
                        chars.len()
                    )));
                }
                let byte = |i: usize| chars.get(i).map(|(b, _)| *b).unwrap_or(s.len());
                Value::String(Arc::from(&s[byte(start as usize)..byte(end as usize)]))
            }
            "charAt" => {
                let at = int(0)?;
                let count = s.chars().count() as i64;
                if at < 0 || at > count {
                    return Err(Stop::error(format!(
                        "charAt({at}) is out of range for a string of {count} characters"
                    )));
                }
                string(s.chars().nth(at as usize).map(String::from).unwrap_or_default())
            }
            "indexOf" | "lastIndexOf" => {
                let needle = text(0)?;
                let found = if name == "indexOf" {
                    s.find(&*needle)
                } else {
                    s.rfind(&*needle)
                };
                Value::Int(found.map_or(-1, |byte| s[..byte].chars().count() as i64))
            }
            _ => return Err(no_overload(name, &[&Value::String(s.clone())])),
        })
    }

    fn list_method(&mut self, name: &str, items: &Arc<Vec<Value>>, args: &[Value]) -> Result<Value> {
        self.meter.charge_elements(items.len())?;
        let receiver = || Value::List(items.clone());
        Ok(match name {
            "join" => {
                let separator = match args.first() {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => return Err(no_overload("join", &[other])),
                    None => Arc::from(""),
                };
                let mut bytes: u128 = separator.len() as u128 * items.len().saturating_sub(1) as u128;
                for item in items.iter() {
                    match item {
                        Value::String(s) => bytes += s.len() as u128,
                        other => return Err(no_overload("join", &[other])),
                    }
                }
                self.meter.build_string(bytes)?;
                let parts: Vec<&str> = items
                    .iter()
                    .filter_map(|item| match item {
                        Value::String(s) => Some(&**s),
                        _ => None,
                    })
                    .collect();
                Value::String(Arc::from(parts.join(&separator)))
            }
            "sum" => {
                let mut total = match items.first() {
                    Some(Value::Double(_)) => Value::Double(0.0),
                    Some(Value::UInt(_)) => Value::UInt(0),
                    _ => Value::Int(0),
                };
                for item in items.iter() {
                    total = match (&total, item) {
                        (Value::Int(a), Value::Int(b)) => Value::Int(a.checked_add(*b).ok_or_else(overflow)?),
                        (Value::UInt(a), Value::UInt(b)) => {
                            Value::UInt(a.checked_add(*b).ok_or_else(overflow)?)
                        }
                        (Value::Double(a), Value::Double(b)) => Value::Double(a + b),
                        (a, b) => return Err(no_overload("sum", &[a, b])),
                    };
                }
                total
            }
            "min" | "max" => self.extreme(name, items, name == "max")?,
            "isSorted" => {
                for pair in items.windows(2) {
                    if self.compare("isSorted", &pair[0], &pair[1])? == Ordering::Greater {
                        return Ok(Value::Bool(false));
                    }
                }
                Value::Bool(true)
            }
            "slice" => {
                let (Some(Value::Int(start)), Some(Value::Int(end))) = (args.first(), args.get(1)) else {
                    return Err(no_overload("slice", &args.iter().collect::<Vec<_>>()));
                };
                if *start < 0 || end < start || *end as usize > items.len() {
                    return Err(Stop::error(format!(
                        "slice({start}, {end}) is out of range for a list of {}",
                        items.len()
                    )));
                }
                Value::List(Arc::new(items[*start as usize..*end as usize].to_vec()))
            }
            "reverse" => Value::List(Arc::new(items.iter().rev().cloned().collect())),
            _ => return Err(no_overload(name, &[&receiver()])),
        })
    }
}

fn literal_value(literal: &LiteralValue) -> Result<Value> {
    Ok(match literal {
        LiteralValue::Boolean(b) => Value::Bool(*b.inner()),
        LiteralValue::Int(i) => Value::Int(*i.inner()),
        LiteralValue::UInt(u) => Value::UInt(*u.inner()),
        LiteralValue::Double(d) => Value::Double(*d.inner()),
        LiteralValue::String(s) => Value::String(Arc::from(s.inner())),
        LiteralValue::Null => Value::Null,
        LiteralValue::Bytes(_) => return Err(Stop::error("bytes are not available")),
    })
}

fn overflow() -> Stop {
    Stop::error("integer overflow")
}

fn no_overload(name: &str, args: &[&Value]) -> Stop {
    let types: Vec<&str> = args.iter().map(|a| a.type_name()).collect();
    Stop::error(format!("no such overload: {name}({})", types.join(", ")))
}

fn arithmetic(name: &str, a: &Value, b: &Value) -> Result<Value> {
    let by_zero = || Stop::error("division by zero");
    Ok(match (a, b) {
        (Value::Int(x), Value::Int(y)) => Value::Int(
            match name {
                operators::SUBSTRACT => x.checked_sub(*y),
                operators::MULTIPLY => x.checked_mul(*y),
                operators::DIVIDE if *y == 0 => return Err(by_zero()),
                operators::DIVIDE => x.checked_div(*y),
                _ if *y == 0 => return Err(by_zero()),
                _ => x.checked_rem(*y),
            }
            .ok_or_else(overflow)?,
        ),
        (Value::UInt(x), Value::UInt(y)) => Value::UInt(
            match name {
                operators::SUBSTRACT => x.checked_sub(*y),
                operators::MULTIPLY => x.checked_mul(*y),
                _ if *y == 0 => return Err(by_zero()),
                operators::DIVIDE => x.checked_div(*y),
                _ => x.checked_rem(*y),
            }
            .ok_or_else(overflow)?,
        ),
        (Value::Double(x), Value::Double(y)) => Value::Double(match name {
            operators::SUBSTRACT => x - y,
            operators::MULTIPLY => x * y,
            operators::DIVIDE => x / y,
            _ => return Err(no_overload(name, &[a, b])),
        }),
        _ => return Err(no_overload(name, &[a, b])),
    })
}

fn index(container: &Value, at: &Value) -> Result<Value> {
    match container {
        Value::List(items) => {
            let i = match at {
                Value::Int(i) => *i,
                Value::UInt(u) => i64::try_from(*u).unwrap_or(i64::MAX),
                Value::Double(d) if d.fract() == 0.0 => *d as i64,
                other => return Err(no_overload("_[_]", &[container, other])),
            };
            usize::try_from(i)
                .ok()
                .and_then(|i| items.get(i))
                .cloned()
                .ok_or_else(|| Stop::error(format!("index {i} out of range for a list of {}", items.len())))
        }
        Value::Map(map) => {
            let key = Key::from_value(at)?;
            map.get(&key)
                .cloned()
                .ok_or_else(|| Stop::error(format!("no such key: {}", at.display())))
        }
        other => Err(no_overload("_[_]", &[other, at])),
    }
}

fn to_int(value: &Value) -> Result<Value> {
    let range = || Stop::error(format!("{} is out of int's range", value.display()));
    Ok(Value::Int(match value {
        Value::Int(i) => *i,
        Value::UInt(u) => i64::try_from(*u).map_err(|_| range())?,
        Value::Double(d)
            if d.is_finite() && *d > -9.223_372_036_854_776e18 && *d < 9.223_372_036_854_776e18 =>
        {
            d.trunc() as i64
        }
        Value::Double(_) => return Err(range()),
        Value::String(s) => s
            .parse::<i64>()
            .map_err(|_| Stop::error(format!("cannot parse {} as an int", value.display())))?,
        other => return Err(no_overload("int", &[other])),
    }))
}

fn to_uint(value: &Value) -> Result<Value> {
    let range = || Stop::error(format!("{} is out of uint's range", value.display()));
    Ok(Value::UInt(match value {
        Value::UInt(u) => *u,
        Value::Int(i) => u64::try_from(*i).map_err(|_| range())?,
        Value::Double(d) if d.is_finite() && *d >= 0.0 && *d < 1.844_674_407_370_955_2e19 => d.trunc() as u64,
        Value::Double(_) => return Err(range()),
        Value::String(s) => s
            .parse::<u64>()
            .map_err(|_| Stop::error(format!("cannot parse {} as a uint", value.display())))?,
        other => return Err(no_overload("uint", &[other])),
    }))
}

fn to_double(value: &Value) -> Result<Value> {
    Ok(Value::Double(match value {
        Value::Double(d) => *d,
        Value::Int(i) => *i as f64,
        Value::UInt(u) => *u as f64,
        Value::String(s) => s
            .parse::<f64>()
            .map_err(|_| Stop::error(format!("cannot parse {} as a double", value.display())))?,
        other => return Err(no_overload("double", &[other])),
    }))
}

fn to_bool(value: &Value) -> Result<Value> {
    Ok(Value::Bool(match value {
        Value::Bool(b) => *b,
        // As Go's strconv.ParseBool, which CEL's bool(string) uses.
        Value::String(s) => match &**s {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => true,
            "0" | "f" | "F" | "false" | "FALSE" | "False" => false,
            _ => return Err(Stop::error(format!("cannot parse {} as a bool", value.display()))),
        },
        other => return Err(no_overload("bool", &[other])),
    }))
}
