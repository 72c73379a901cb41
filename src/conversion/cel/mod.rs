//! CEL for `changed[]`: `self` is a field's value in one version, the result its value in
//! the other.
//!
//! Parsed with cel-rust's parser (the one kube-cel uses) and evaluated by our own evaluator
//! of a documented subset, because cel-rust's interpreter can neither meter cost nor cap
//! what an expression allocates, and copies a comprehension's accumulator at every step.
//! Here every expression is checked when the policy is read (only `self` in scope, only the
//! functions of [`functions::FUNCTIONS`] with their arities), and every evaluation runs
//! under a [`Budget`]: each step is charged, strings and lists are refused over their caps
//! before they are allocated, and `map`/`filter` append in place, so they are linear.

mod eval;
mod functions;
mod meter;
mod value;

use cel::common::ast::IdedExpr;
use serde_json::Value as Json;

pub use meter::{Budget, MAX_LIST_ELEMENTS, MAX_STRING_BYTES, PER_CALL_COST_LIMIT, PER_REVIEW_COST_LIMIT};

/// Longest expression accepted (bytes).
pub const MAX_SOURCE_BYTES: usize = 1024;

/// Deepest nesting of brackets and conditionals accepted. The parser recurses through
/// about ten grammar rules per level (and panics on arithmetic overflow near 40 levels), so
/// this is checked on the text before it parses; it also bounds the evaluator's recursion.
pub const MAX_NESTING: usize = 16;

/// Stack of the thread that parses: the parser's recursion needs far more than a test or
/// runtime thread has at `MAX_NESTING` in unoptimised builds.
const PARSER_STACK_BYTES: usize = 32 << 20;

/// A compiled, checked expression.
pub struct Expression {
    source: String,
    ast: IdedExpr,
    checked: functions::Checked,
}

impl std::fmt::Debug for Expression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Expression").field(&self.source).finish()
    }
}

/// Why an evaluation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalError {
    pub message: String,
    /// Whether a limit (cost, size) stopped it, rather than an error of the expression on
    /// this value.
    pub over_limit: bool,
}

impl std::fmt::Display for EvalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Expression {
    /// Compiles and checks `source`; the error says why it cannot run (syntax, a name other
    /// than `self`, an unknown function or a wrong number of arguments, naming it).
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
        let depth = nesting_depth(source);
        if depth > MAX_NESTING {
            return Err(format!(
                "the expression nests {depth} levels deep (brackets and conditionals); at most {MAX_NESTING} are allowed"
            ));
        }
        let ast = parse(source)?;
        let checked = functions::check(&ast)?;
        Ok(Expression {
            source: source.to_owned(),
            ast,
            checked,
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Evaluates with `self` bound to `value` under a fresh review budget.
    pub fn evaluate(&self, value: &Json) -> Result<Json, EvalError> {
        self.evaluate_within(value, &mut Budget::default())
    }

    /// Evaluates with `self` bound to `value`, drawing on `budget`; the result must be a
    /// JSON value. What the evaluation used is taken off the budget, whether it succeeded
    /// or not. Writing out the result is free up to the size of the input (`self` on a large
    /// field costs nearly nothing); everything else the evaluation did is charged, however
    /// small its result (`self.size()` pays for scanning the string).
    pub fn evaluate_within(&self, value: &Json, budget: &mut Budget) -> Result<Json, EvalError> {
        let meter = meter::Meter::new(budget);
        let mut input_units = 0;
        let this = value::Value::from_json(value, &mut input_units);
        let mut evaluator = eval::Evaluator::new(meter, this, &self.checked.patterns);
        let mut written = 0;
        let outcome = evaluator.eval(&self.ast).and_then(|result| {
            evaluator.meter.allow(input_units);
            let before = evaluator.meter.used();
            let json = result.to_json(&mut evaluator.meter);
            written = evaluator.meter.used().saturating_sub(before);
            json
        });
        let used = evaluator.meter.used().saturating_sub(written.min(input_units));
        budget.remaining = budget.remaining.saturating_sub(used);
        outcome.map_err(|stop| EvalError {
            over_limit: matches!(stop, meter::Stop::Limit(_)),
            message: stop.message(),
        })
    }
}

/// Parses on a thread of its own with a large stack; a panic of the parser is an error.
fn parse(source: &str) -> Result<IdedExpr, String> {
    let owned = source.to_owned();
    let parser = std::thread::Builder::new()
        .name("cel-parser".to_owned())
        .stack_size(PARSER_STACK_BYTES)
        .spawn(move || {
            cel::parser::Parser::new()
                .parse(&owned)
                .map_err(|e| e.to_string())
        })
        .map_err(|e| format!("cannot start the parser: {e}"))?;
    match parser.join() {
        Ok(parsed) => parsed.map_err(|e| format!("does not compile: {e}")),
        Err(_) => Err("does not compile: the CEL parser failed on it".to_owned()),
    }
}

/// How deep brackets and conditionals (`?`) nest, outside string literals. Literals are
/// read as CEL's lexer reads them: a `'` or `"` (or three of them) starts one, a backslash
/// escapes the next character, except in a raw literal (`r'...'`, `R"""..."""`, also after a
/// bytes prefix `b`), where it escapes nothing; `r` and `b` are prefixes only where a token
/// starts, not at the end of a name (`bar'x'` is the name `bar` and a literal).
fn nesting_depth(source: &str) -> usize {
    let bytes = source.as_bytes();
    let (mut depth, mut deepest, mut conditionals) = (0usize, 0usize, 0usize);
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => i = skip_literal(bytes, i, false),
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let word = &bytes[start..i];
                let prefix = matches!(word.to_ascii_lowercase().as_slice(), b"r" | b"b" | b"br");
                if prefix && matches!(bytes.get(i), Some(b'\'' | b'"')) {
                    let raw = word.iter().any(|c| c.eq_ignore_ascii_case(&b'r'));
                    i = skip_literal(bytes, i, raw) + 1;
                }
                continue;
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b'?' => conditionals += 1,
            _ => {}
        }
        deepest = deepest.max(depth + conditionals);
        i += 1;
    }
    deepest
}

/// The index of the last byte of the literal whose opening quote is at `start` (or the end).
fn skip_literal(bytes: &[u8], start: usize, raw: bool) -> usize {
    let quote = bytes[start];
    let width = if bytes[start..].starts_with(&[quote; 3]) {
        3
    } else {
        1
    };
    let closing = &[quote; 3][..width];
    let mut i = start + width;
    while i < bytes.len() {
        if bytes[i] == b'\\' && !raw {
            i += 2;
            continue;
        }
        if bytes[i..].starts_with(closing) {
            return i + width - 1;
        }
        i += 1;
    }
    bytes.len()
}

/// The functions an expression may call, as `name/arity` with their call form, for docs
/// and the book test (`the_book_documents_every_function`).
pub fn function_names() -> Vec<String> {
    functions::FUNCTIONS
        .iter()
        .map(|f| match f.style {
            functions::Style::Math => format!("math.{}", f.name),
            _ => f.name.to_owned(),
        })
        .collect()
}

#[cfg(test)]
mod tests;
