//! The functions and macros the evaluator has, with their arities, and the check that an
//! expression calls nothing else: the same table the evaluator dispatches on.

use std::collections::HashMap;
use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};

use crate::re2::Pattern;

/// How a function is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Style {
    /// `f(x, ...)`.
    Global,
    /// `x.f(...)`.
    Method,
    /// `f(x)` or `x.f()`.
    Both,
    /// `math.f(...)`.
    Math,
}

/// One function: its name, how it is called and how many arguments it takes (the receiver
/// of a method not counted).
#[derive(Debug)]
pub(super) struct Function {
    pub(super) name: &'static str,
    pub(super) style: Style,
    pub(super) arities: &'static [usize],
}

const fn f(name: &'static str, style: Style, arities: &'static [usize]) -> Function {
    Function { name, style, arities }
}

/// Every function an expression may call (besides operators and macros). Documented in the
/// book's conversion page (docs/src/concepts/conversion.md); `the_book_documents_every_function`
/// keeps the two in step.
pub(super) const FUNCTIONS: &[Function] = &[
    // Conversions.
    f("int", Style::Global, &[1]),
    f("uint", Style::Global, &[1]),
    f("double", Style::Global, &[1]),
    f("string", Style::Global, &[1]),
    f("bool", Style::Global, &[1]),
    f("dyn", Style::Global, &[1]),
    f("size", Style::Both, &[1]),
    // Strings.
    f("contains", Style::Method, &[1]),
    f("startsWith", Style::Method, &[1]),
    f("endsWith", Style::Method, &[1]),
    f("matches", Style::Method, &[1]),
    f("lowerAscii", Style::Method, &[0]),
    f("upperAscii", Style::Method, &[0]),
    f("trim", Style::Method, &[0]),
    f("replace", Style::Method, &[2, 3]),
    f("split", Style::Method, &[1, 2]),
    f("substring", Style::Method, &[1, 2]),
    f("charAt", Style::Method, &[1]),
    f("indexOf", Style::Method, &[1]),
    f("lastIndexOf", Style::Method, &[1]),
    f("join", Style::Method, &[0, 1]),
    // Lists.
    f("sum", Style::Method, &[0]),
    f("min", Style::Method, &[0]),
    f("max", Style::Method, &[0]),
    f("isSorted", Style::Method, &[0]),
    f("slice", Style::Method, &[2]),
    f("reverse", Style::Method, &[0]),
    // Math.
    f("greatest", Style::Math, &[1, 2, 3, 4, 5, 6, 7, 8]),
    f("least", Style::Math, &[1, 2, 3, 4, 5, 6, 7, 8]),
    f("abs", Style::Math, &[1]),
    f("ceil", Style::Math, &[1]),
    f("floor", Style::Math, &[1]),
    f("round", Style::Math, &[1]),
];

/// The macros the parser expands (into comprehensions or a presence test).
pub(super) const MACROS: &[&str] = &["has", "all", "exists", "exists_one", "map", "filter"];

/// Operators, as the parser names them, and their arities.
const OPERATORS: &[(&str, usize)] = &[
    (operators::CONDITIONAL, 3),
    (operators::LOGICAL_AND, 2),
    (operators::LOGICAL_OR, 2),
    (operators::LOGICAL_NOT, 1),
    (operators::SUBSTRACT, 2),
    (operators::ADD, 2),
    (operators::MULTIPLY, 2),
    (operators::DIVIDE, 2),
    (operators::MODULO, 2),
    (operators::EQUALS, 2),
    (operators::NOT_EQUALS, 2),
    (operators::GREATER_EQUALS, 2),
    (operators::LESS_EQUALS, 2),
    (operators::GREATER, 2),
    (operators::LESS, 2),
    (operators::NEGATE, 1),
    (operators::INDEX, 2),
    (operators::IN, 2),
    (operators::NOT_STRICTLY_FALSE, 1),
];

/// What checking an expression finds out: the compiled patterns of its `matches` calls,
/// by the call's expression id.
#[derive(Debug, Default)]
pub(super) struct Checked {
    pub(super) patterns: HashMap<u64, Arc<Pattern>>,
}

/// Checks that the expression names only `self` and the variables of its comprehensions,
/// and calls only known functions with their arities. The message names the function.
pub(super) fn check(expr: &IdedExpr) -> Result<Checked, String> {
    let mut checked = Checked::default();
    walk(expr, &mut Vec::new(), &mut checked)?;
    Ok(checked)
}

fn walk<'a>(expr: &'a IdedExpr, bound: &mut Vec<&'a str>, checked: &mut Checked) -> Result<(), String> {
    match &expr.expr {
        Expr::Ident(name) if name == "self" || bound.contains(&name.as_str()) => Ok(()),
        Expr::Ident(name) => Err(format!("unknown name {name}: only self is available")),
        Expr::Comprehension(comprehension) => {
            walk(&comprehension.iter_range, bound, checked)?;
            let depth = bound.len();
            bound.push(&comprehension.accu_var);
            walk(&comprehension.accu_init, bound, checked)?;
            bound.push(&comprehension.iter_var);
            bound.extend(comprehension.iter_var2.as_deref());
            let result = [
                &comprehension.loop_cond,
                &comprehension.loop_step,
                &comprehension.result,
            ]
            .into_iter()
            .try_for_each(|part| walk(part, bound, checked));
            bound.truncate(depth);
            result
        }
        Expr::Call(call) => {
            check_call(
                expr.id,
                &call.func_name,
                call.target.as_deref(),
                &call.args,
                bound,
                checked,
            )?;
            if let Some(target) = &call.target
                && !is_math(target, bound)
            {
                walk(target, bound, checked)?;
            }
            call.args.iter().try_for_each(|arg| walk(arg, bound, checked))
        }
        Expr::List(list) => list
            .elements
            .iter()
            .try_for_each(|element| walk(element, bound, checked)),
        Expr::Map(map) => map.entries.iter().try_for_each(|entry| match &entry.expr {
            EntryExpr::MapEntry(entry) => {
                walk(&entry.key, bound, checked)?;
                walk(&entry.value, bound, checked)
            }
            EntryExpr::StructField(_) => {
                Err("message literals are not available: build a map instead".to_owned())
            }
        }),
        Expr::Struct(_) => Err("message literals are not available: build a map instead".to_owned()),
        Expr::Select(select) => walk(&select.operand, bound, checked),
        Expr::Literal(LiteralValue::Bytes(_)) => {
            Err("bytes literals are not available (no JSON form)".to_owned())
        }
        Expr::Literal(_) => Ok(()),
        Expr::Unspecified => Err("the expression is incomplete".to_owned()),
    }
}

/// `math.f(...)`: the receiver is the namespace, not a value.
pub(super) fn is_math(target: &IdedExpr, bound: &[&str]) -> bool {
    matches!(&target.expr, Expr::Ident(name) if name == "math" && !bound.contains(&"math"))
}

fn check_call(
    id: u64,
    name: &str,
    target: Option<&IdedExpr>,
    args: &[IdedExpr],
    bound: &[&str],
    checked: &mut Checked,
) -> Result<(), String> {
    if let Some((_, arity)) = OPERATORS.iter().find(|(op, _)| *op == name) {
        return if target.is_none() && args.len() == *arity {
            Ok(())
        } else {
            Err(format!("operator {name} takes {arity} operands"))
        };
    }
    let math = target.is_some_and(|t| is_math(t, bound));
    let style = match (target, math) {
        (None, _) => Style::Global,
        (Some(_), true) => Style::Math,
        (Some(_), false) => Style::Method,
    };
    let shown = match style {
        Style::Math => format!("math.{name}"),
        _ => name.to_owned(),
    };
    let candidates: Vec<&Function> = FUNCTIONS.iter().filter(|f| f.name == name).collect();
    if candidates.is_empty() {
        if MACROS.contains(&name) {
            return Err(format!(
                "the macro {name} is called with {} argument(s): see docs/src/concepts/conversion.md for its form (e.g. list.{name}(x, <expression of x>))",
                args.len()
            ));
        }
        let suggestion = FUNCTIONS
            .iter()
            .find(|f| f.name.eq_ignore_ascii_case(name))
            .map(|f| format!(" (did you mean {}?)", f.name))
            .unwrap_or_default();
        return Err(format!("unknown function {shown}{suggestion}"));
    }
    let Some(function) = candidates.iter().find(|f| match (f.style, style) {
        (Style::Both, Style::Global | Style::Method) => true,
        (a, b) => a == b,
    }) else {
        let how = match candidates[0].style {
            Style::Global => format!("{name}(...), not as a method"),
            Style::Method => format!("x.{name}(...), as a method"),
            Style::Math => format!("math.{name}(...)"),
            Style::Both => format!("{name}(x) or x.{name}()"),
        };
        return Err(format!("{shown} is called as {how}"));
    };
    let count = match (function.style, style) {
        // size(x) takes its value as an argument, x.size() as the receiver.
        (Style::Both, Style::Method) => args.len() + 1,
        _ => args.len(),
    };
    if !function.arities.contains(&count) {
        let expected: Vec<String> = function.arities.iter().map(usize::to_string).collect();
        return Err(format!(
            "{shown} takes {} argument(s), not {count}",
            expected.join(" or ")
        ));
    }
    if name == "matches" {
        let Some(IdedExpr {
            expr: Expr::Literal(LiteralValue::String(pattern)),
            ..
        }) = args.first()
        else {
            return Err("matches takes a string literal as its pattern".to_owned());
        };
        // Go's RE2 syntax and meaning, as cel-go's `matches`; compiled once per pattern.
        let compiled = crate::re2::compile(pattern.inner())
            .map_err(|e| format!("matches: the pattern does not compile: {e}"))?;
        checked.patterns.insert(id, compiled);
    }
    Ok(())
}
