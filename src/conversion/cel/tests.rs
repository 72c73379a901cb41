use serde_json::{Value, json};

use super::*;

fn eval(source: &str, value: Value) -> Result<Value, String> {
    Expression::compile(source)?
        .evaluate(&value)
        .map_err(|e| e.message)
}

fn refused(source: &str) -> String {
    Expression::compile(source).expect_err(source)
}

/// Cost units one evaluation used.
fn cost(source: &str, value: &Value) -> u64 {
    let mut budget = Budget::default();
    Expression::compile(source)
        .expect(source)
        .evaluate_within(value, &mut budget)
        .expect(source);
    budget.per_review - budget.remaining
}

#[test]
fn type_changes_evaluate() {
    assert_eq!(eval("int(self)", json!("8080")), Ok(json!(8080)));
    assert_eq!(eval("string(self)", json!(8080)), Ok(json!("8080")));
    assert_eq!(eval("int(self)", json!("08080")), Ok(json!(8080)));
    assert_eq!(eval("[self]", json!("a")), Ok(json!(["a"])));
    assert_eq!(eval("self[0]", json!(["a", "b"])), Ok(json!("a")));
    assert_eq!(eval("{'value': self}", json!(3)), Ok(json!({"value": 3})));
    assert_eq!(eval("self.value", json!({"value": 3})), Ok(json!(3)));
    // Map results come out in key order, whatever the order they were written in.
    let map = eval("{'b': 1, 'c': 3, 'a': self}", json!(2)).expect("a map");
    assert_eq!(map.to_string(), r#"{"a":2,"b":1,"c":3}"#);
    assert_eq!(eval("self.lowerAscii()", json!("Always")), Ok(json!("always")));
    assert_eq!(eval("self.upperAscii()", json!("always")), Ok(json!("ALWAYS")));
    assert_eq!(
        eval("self.map(x, string(x))", json!([1, 2])),
        Ok(json!(["1", "2"]))
    );
    assert_eq!(eval("self * 2", json!(21)), Ok(json!(42)));
    assert_eq!(eval("double(self) / 2.0", json!(3)), Ok(json!(1.5)));
    assert_eq!(eval("uint(self)", json!(3)), Ok(json!(3)));
    assert!(
        eval("int(self)", json!("abc"))
            .unwrap_err()
            .contains("cannot parse")
    );
    assert!(
        eval("uint(self)", json!(-1))
            .unwrap_err()
            .contains("out of uint's range")
    );
}

#[test]
fn the_documented_functions_work() {
    let cases = [
        ("size(self)", json!("héllo"), json!(5)),
        ("self.size()", json!([1, 2]), json!(2)),
        ("self.contains('ll')", json!("hello"), json!(true)),
        (
            "self.startsWith('he') && self.endsWith('lo')",
            json!("hello"),
            json!(true),
        ),
        ("self.matches('^[0-9]+$')", json!("8080"), json!(true)),
        ("self.trim()", json!("  a b  "), json!("a b")),
        ("self.replace('-', '_')", json!("a-b-c"), json!("a_b_c")),
        ("self.replace('-', '_', 1)", json!("a-b-c"), json!("a_b-c")),
        ("self.split(',')", json!("a,b,c"), json!(["a", "b", "c"])),
        ("self.split(',', 2)", json!("a,b,c"), json!(["a", "b,c"])),
        ("self.substring(1, 3)", json!("héllo"), json!("él")),
        ("self.substring(2)", json!("héllo"), json!("llo")),
        ("self.charAt(1)", json!("héllo"), json!("é")),
        ("self.indexOf('l')", json!("héllo"), json!(2)),
        ("self.lastIndexOf('l')", json!("héllo"), json!(3)),
        ("self.join('-')", json!(["a", "b"]), json!("a-b")),
        ("self.join()", json!(["a", "b"]), json!("ab")),
        ("self.sum()", json!([1, 2, 3]), json!(6)),
        ("self.min()", json!([3, 1, 2]), json!(1)),
        ("self.max()", json!([3, 1, 2]), json!(3)),
        ("self.isSorted()", json!([1, 2, 2]), json!(true)),
        ("self.slice(1, 3)", json!([1, 2, 3, 4]), json!([2, 3])),
        ("self.reverse()", json!([1, 2, 3]), json!([3, 2, 1])),
        ("math.greatest(self, 10)", json!(3), json!(10)),
        ("math.least(self)", json!([4, 2, 9]), json!(2)),
        ("math.abs(self)", json!(-3), json!(3)),
        ("math.ceil(self)", json!(1.2), json!(2.0)),
        ("math.floor(self)", json!(1.8), json!(1.0)),
        ("math.round(self)", json!(1.5), json!(2.0)),
        ("bool(self)", json!("true"), json!(true)),
        ("dyn(self)", json!(1), json!(1)),
        ("self.filter(x, x > 1)", json!([1, 2, 3]), json!([2, 3])),
        ("self.map(x, x > 1, x * 10)", json!([1, 2, 3]), json!([20, 30])),
        ("self.all(x, x > 0)", json!([1, 2]), json!(true)),
        ("self.exists(x, x == 2)", json!([1, 2]), json!(true)),
        ("self.exists_one(x, x == 2)", json!([2, 2]), json!(false)),
        ("has(self.a) ? self.a : 'none'", json!({"b": 1}), json!("none")),
        ("'a' in self", json!({"a": 1}), json!(true)),
        ("2 in self", json!([1, 2]), json!(true)),
        ("self.map(k, k)", json!({"b": 1, "a": 2}), json!(["a", "b"])),
        ("self == 1.0", json!(1), json!(true)),
        ("-self", json!(2), json!(-2)),
        ("self % 3", json!(7), json!(1)),
        ("self + [3]", json!([1, 2]), json!([1, 2, 3])),
        ("self + 'b'", json!("a"), json!("ab")),
        (
            "self.map(x, x.map(y, y + 1))",
            json!([[1], [2, 3]]),
            json!([[2], [3, 4]]),
        ),
        // Errors are absorbed by || and && as CEL does.
        (
            "self.exists(x, x == 'a' || int(x) > 1)",
            json!(["a", "b"]),
            json!(true),
        ),
        ("false && int('x') > 1", json!(null), json!(false)),
    ];
    for (source, input, expected) in cases {
        assert_eq!(eval(source, input.clone()), Ok(expected), "{source} on {input}");
    }
}

#[test]
fn names_functions_and_arities_are_checked_when_compiled() {
    assert!(refused("int(").contains("does not compile"));
    assert!(refused("other + 1").contains("only self"));
    assert_eq!(
        refused("self.lowerascii()"),
        "unknown function lowerascii (did you mean lowerAscii?)"
    );
    assert_eq!(refused("self.frobnicate()"), "unknown function frobnicate");
    assert_eq!(
        refused("self.replace('a')"),
        "replace takes 2 or 3 argument(s), not 1"
    );
    assert_eq!(
        refused("self.lowerAscii(1)"),
        "lowerAscii takes 0 argument(s), not 1"
    );
    assert_eq!(
        refused("lowerAscii(self)"),
        "lowerAscii is called as x.lowerAscii(...), as a method"
    );
    assert_eq!(
        refused("self.int()"),
        "int is called as int(...), not as a method"
    );
    assert_eq!(refused("math.sqrt(self)"), "unknown function math.sqrt");
    assert!(refused("self.map(x)").contains("macro map"));
    assert!(refused("self.matches(self)").contains("string literal"));
    assert!(refused("self.matches('(')").contains("does not compile"));
    assert!(refused("timestamp(self)").contains("unknown function timestamp"));
    assert!(refused("b'abc'").contains("bytes"));
    assert!(refused(&"1 + ".repeat(400)).contains("bytes long"));
    assert!(refused(" ").contains("empty"));
    // Deep nesting is refused before the parser could exhaust its stack.
    let nested = |n: usize| format!("{}self{}", "[".repeat(n), "]".repeat(n));
    let conditionals = |n: usize| format!("{}1", "self ? 1 : ".repeat(n));
    assert!(Expression::compile(&nested(MAX_NESTING)).is_ok());
    assert!(Expression::compile(&conditionals(MAX_NESTING)).is_ok());
    assert!(refused(&nested(MAX_NESTING + 1)).contains("nests 17 levels deep"));
    assert!(refused(&conditionals(60)).contains("nests 60 levels deep"));
    assert!(refused(&nested(300)).contains("at most 16"));
    // Brackets inside strings do not count.
    assert!(Expression::compile(&format!("'{}' + self", "[".repeat(100))).is_ok());
}

#[test]
fn results_without_a_json_form_are_errors() {
    assert!(eval("{1: 2}", json!(null)).unwrap_err().contains("not a string"));
    assert!(
        eval("1.0 / 0.0", json!(null))
            .unwrap_err()
            .contains("not a JSON number")
    );
}

fn list(n: usize) -> Value {
    Value::Array((0..n).map(|i| json!(i)).collect())
}

#[test]
fn comprehensions_are_linear() {
    let items = list(16_000);
    let doubled = eval("self.map(x, x + x)", items.clone()).expect("16,000 items map");
    assert_eq!(doubled.as_array().map(Vec::len), Some(16_000));
    assert_eq!(doubled[15_999], json!(31_998));
    for source in [
        "self.map(x, x + x)",
        "self.filter(x, x % 2 == 0)",
        "self.all(x, x >= 0)",
        "self.exists(x, x < 0)",
    ] {
        let (small, large) = (cost(source, &list(8_000)), cost(source, &list(16_000)));
        // Twice the items, about twice the cost: no step copies what came before.
        assert!(
            large <= small * 2 + 100,
            "{source}: {small} for 8,000, {large} for 16,000"
        );
        assert!(
            large < PER_CALL_COST_LIMIT / 4,
            "{source}: {large} units for 16,000 items"
        );
    }
}

#[test]
fn bombs_stop_at_a_limit() {
    let over = |source: &str, value: Value| {
        let error = Expression::compile(source)
            .expect(source)
            .evaluate(&value)
            .expect_err(source);
        assert!(error.over_limit, "{source}: {}", error.message);
        error.message
    };
    let text = json!("x".repeat(1000));
    // ~1 GB if it ran: refused before the second string is allocated.
    let message = over("self.replace('', self).replace('', self)", text.clone());
    assert!(
        message.contains("would build a string of") && message.contains("1048576"),
        "{message}"
    );
    // Small in memory (one list shared 16,000 times) but 256 million values as JSON.
    let message = over("self.map(x, self)", list(16_000));
    assert!(message.contains("cost limit of 1000000"), "{message}");
    assert!(over("self.map(x, self.map(y, x + y))", list(2_000)).contains("cost limit"));
    assert!(over("self + self + self + self", list(60_000)).contains("at most 100000"));
    assert!(over("self.split('')", json!("y".repeat(200_000))).contains("at most 100000"));
    let words = Value::Array(vec![json!("z".repeat(1_000)); 1_000]);
    assert!(over("self.map(x, self.join(','))", words.clone()).contains("cost limit"));
    assert!(over("self.join(',') + self.join(',')", words).contains("at most 1048576"));
}

#[test]
fn a_review_budget_is_shared_by_its_evaluations() {
    let expression = Expression::compile("self.map(x, x + 1)").expect("compiles");
    let mut budget = Budget::new(100_000, PER_CALL_COST_LIMIT);
    let value = list(5_000);
    let mut failure = None;
    for _ in 0..10 {
        if let Err(error) = expression.evaluate_within(&value, &mut budget) {
            failure = Some(error);
            break;
        }
    }
    let failure = failure.expect("ten evaluations of 5,000 items exceed 100,000 units");
    assert!(failure.over_limit);
    assert!(
        failure.message.contains("review's cost budget of 100000"),
        "{}",
        failure.message
    );
}

/// Every function the evaluator has is in the book's table (and so documented).
#[test]
fn the_book_documents_every_function() {
    let page = include_str!("../../../docs/src/concepts/conversion.md");
    let table = page
        .split("| kind | functions |")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("the CEL function table of docs/src/concepts/conversion.md");
    for name in function_names() {
        assert!(
            table.contains(&format!("`{name}")) || table.contains(&format!(" {name}(")),
            "{name} is not in the CEL function table of docs/src/concepts/conversion.md"
        );
    }
}

/// A string literal as the scanner must skip it: cel-rust's parser decides what a literal
/// is. In a raw string (`r'...'`, `R"..."`, triple-quoted, with or without a `b` prefix) a
/// backslash escapes nothing, so `r'\'` ends at its second quote.
#[test]
fn brackets_after_a_raw_string_ending_in_a_backslash_count() {
    let deep = format!(
        "{}self{}",
        "[".repeat(MAX_NESTING + 1),
        "]".repeat(MAX_NESTING + 1)
    );
    for raw in [r"r'\'", r#"R"\""#, r"r'''\'''", r#"br"\""#, r"BR'\'"] {
        let source = format!("{raw} == {raw} ? {deep} : self");
        assert!(
            nesting_depth(&source) > MAX_NESTING,
            "{source}: {} levels seen",
            nesting_depth(&source)
        );
        assert!(refused(&source).contains("levels deep"), "{source}");
    }
    // The escape still escapes in a string that is not raw, and an `r` ending a name is no prefix.
    assert_eq!(nesting_depth(r"'\'(' + [self]"), 1);
    assert_eq!(nesting_depth(r"self.bar'\'(' + [self]"), 1);
}

mod literals {
    use proptest::prelude::*;

    use super::super::nesting_depth;

    /// A literal: an optional prefix, a quote and text that may hold backslashes, quotes and
    /// brackets.
    fn literal() -> impl Strategy<Value = String> {
        let prefix = prop::sample::select(vec!["", "r", "R", "b", "B", "br", "bR", "Br", "BR", "rb"]);
        let quote = prop::sample::select(vec!["'", "\"", "'''", "\"\"\""]);
        let text = prop::collection::vec(
            prop::sample::select(vec![
                "a", "\\", "'", "\"", "(", ")", "[", "]", "{", "?", "\\\\", "\\'",
            ]),
            0..8,
        );
        (prefix, quote, text)
            .prop_map(|(prefix, quote, text)| format!("{prefix}{quote}{}{quote}", text.concat()))
    }

    /// Whether cel-rust's parser reads `source` as a single string or bytes literal.
    fn is_one_literal(source: &str) -> bool {
        use cel::common::ast::{Expr, LiteralValue};
        matches!(
            cel::parser::Parser::new().parse(source).map(|e| e.expr),
            Ok(Expr::Literal(LiteralValue::String(_) | LiteralValue::Bytes(_)))
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1_000, max_global_rejects: 20_000, ..ProptestConfig::default() })]

        /// Whatever a literal holds, the scanner skips exactly it: brackets around it count,
        /// brackets in it do not.
        #[test]
        fn the_scanner_skips_exactly_what_the_parser_reads_as_a_literal(literal in literal()) {
            prop_assume!(is_one_literal(&literal));
            prop_assert_eq!(nesting_depth(&literal), 0, "{}", literal);
            let nested = format!("(({literal} + [{literal}]))");
            prop_assert_eq!(nesting_depth(&nested), 3, "{}", nested);
            let after = format!("{literal} == {literal} ? [[self]] : self");
            prop_assert_eq!(nesting_depth(&after), 3, "{}", after);
        }
    }
}

/// What a review's budget is charged for an evaluation: everything it did, less writing out
/// a result no larger than its input.
#[test]
fn a_small_result_does_not_hide_the_work_behind_it() {
    let text = json!("é".repeat(500_000)); // 1,000,000 bytes
    // Counting the characters scans 1,000,000 bytes: 100,000 units at cel-go's 0.1 a byte.
    let counted = cost("self.size()", &text);
    assert!(counted >= 100_000, "self.size() on 1 MB cost {counted} units");
    // Handing the field back unchanged costs next to nothing.
    let handed_back = cost("self", &text);
    assert!(handed_back < 10, "self on 1 MB cost {handed_back} units");
    // So a review of many such evaluations runs out of budget.
    let expression = Expression::compile("self.size()").expect("compiles");
    let mut budget = Budget::default();
    let evaluations = (0..1_000)
        .take_while(|_| expression.evaluate_within(&text, &mut budget).is_ok())
        .count();
    assert!(
        (90..=100).contains(&evaluations),
        "{evaluations} evaluations of self.size() on 1 MB fit a review"
    );
}

/// `n` bytes of the alphabet, over and over.
fn letters(n: usize) -> Value {
    json!(
        "abcdefghijklmnopqrstuvwxyz"
            .chars()
            .cycle()
            .take(n)
            .collect::<String>()
    )
}

/// `matches` costs the traversal of its input times the states of the pattern's automaton,
/// charged before it runs; `contains` the product of both sizes (cel-go's runtime cost).
#[test]
fn matches_and_contains_cost_as_much_as_they_can_run() {
    let states = |pattern: &str| crate::re2::compile(pattern).expect("compiles").states() as u64;
    let simple = cost("self.matches('^[a-z]+$')", &letters(100_000));
    let traversal = 100_001u64.div_ceil(10);
    let per_state = meter::UNITS_PER_STATE;
    assert!(
        simple >= traversal * states("^[a-z]+$") * per_state
            && simple < traversal * states("^[a-z]+$") * per_state + 20,
        "{simple}"
    );
    // A short pattern with a large automaton costs its automaton, not its length.
    let classes = cost(r"self.matches('[\\pL\\pN]{3}0')", &letters(1_000));
    assert!(classes >= 101 * states(r"[\pL\pN]{3}0") * per_state, "{classes}");
    assert!(states(r"[\pL\pN]{3}0") > 500);
    let needle = cost("self.contains('0123456789')", &letters(100_000));
    assert!(needle >= 10_000, "{needle}");
    // Over the limit, refused before it runs.
    let big = letters(1_500_000);
    let error = Expression::compile("self.matches('(a|b)*a(a|b){20}c')")
        .expect("compiles")
        .evaluate(&big)
        .expect_err("over the per-call limit");
    assert!(
        error.over_limit && error.message.contains("cost limit"),
        "{}",
        error.message
    );
}

/// Patterns that make regular-expression engines slow (a lazy DFA that blows up, large
/// Unicode classes, nested repetitions), each over the largest input the per-call limit lets
/// it read (at most 3 MiB, over the apiserver's request limit), end in time; over 1.5 MB
/// (etcd's object limit) the costly ones are refused at once.
///
/// A timed assertion, allowed here as an upper bound far above typical: each takes tens of
/// milliseconds in a release build on this project's 2-core machine (docs/src/concepts/conversion.md, "Limits of an
/// expression"); 1 s leaves room for a loaded machine. The regex engine is optimized in the
/// test profile (Cargo.toml), as in production.
#[test]
fn a_pathological_pattern_ends_in_time_over_the_largest_input_allowed() {
    let alternating = |n: usize| {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let text: String = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x.is_multiple_of(2) { 'a' } else { 'b' }
            })
            .collect();
        json!(text)
    };
    let cases: [(&str, &dyn Fn(usize) -> Value); 7] = [
        ("(a|b)*a(a|b){20}c", &alternating),
        ("[ab]{1,50}c", &alternating),
        ("(a|b)*a(a|b){12}[ab]{1,30}c", &alternating),
        (r"(\\pL|\\pN|\\pS){20}0", &letters),
        ("(x+x+)+y", &letters),
        (r"\\w{50}\\s", &letters),
        ("(?i)[a-z]{300}0", &letters),
    ];
    let limit = 3 << 20;
    for (pattern, input) in cases {
        let source = format!("self.matches('{pattern}')");
        let expression = Expression::compile(&source).expect(&source);
        let states = crate::re2::compile(&pattern.replace(r"\\", r"\"))
            .expect(pattern)
            .states();
        // The largest input whose cost fits the per-call limit (with room for the nodes).
        let fits = ((PER_CALL_COST_LIMIT - 10) / (states as u64 * meter::UNITS_PER_STATE) * 10) as usize - 10;
        let n = fits.min(limit);
        let value = input(n);
        let started = std::time::Instant::now();
        let answer = expression.evaluate(&value);
        let took = started.elapsed();
        assert!(answer.is_ok(), "{source} over {n} bytes: {answer:?}");
        assert!(
            took < std::time::Duration::from_secs(1),
            "{source} over {n} bytes took {took:?}"
        );
        if n < 1_500_000 {
            let started = std::time::Instant::now();
            let refused = expression
                .evaluate(&input(1_500_000))
                .expect_err("over the limit");
            assert!(refused.over_limit, "{source}: {}", refused.message);
            assert!(
                started.elapsed() < std::time::Duration::from_secs(1),
                "{source} refused late"
            );
        }
    }
}
