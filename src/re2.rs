//! Regular expressions as the apiserver has them: Go's `regexp` (RE2 syntax), for a CRD
//! schema's `pattern` and CEL's `matches`, compiled by the `regex` crate with Go's meaning,
//! bounded in size and compiled once per pattern.
//!
//! The two dialects agree on almost everything (both are RE2 descendants, linear-time, with
//! Unicode `.`, `\pL` and case folding); where they differ, the pattern is rewritten to say
//! what Go means before it is compiled:
//!
//! - `\d`, `\s`, `\w` and their negations are ASCII in Go (`[0-9]`, `[\t\n\f\r ]`,
//!   `[0-9A-Za-z_]`), Unicode in the `regex` crate; `\b` and `\B` are ASCII word boundaries;
//! - `\Q...\E` quotes literal text in Go only;
//! - in a bracketed class, Go reads `[` (other than `[:alpha:]`), `&&`, `--` and `~~` as
//!   plain characters, the `regex` crate as nesting and set operations;
//! - `\123` is an octal escape in Go (enabled here).
//!
//! A leaf: it imports nothing of the crate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use regex::{Regex, RegexBuilder};

/// Largest compiled program of one pattern (bytes of its automaton). Go's parser refuses
/// repetition counts over 1,000, so a pattern the apiserver accepted compiles far below this
/// unless it nests large counts or Unicode classes.
pub const MAX_COMPILED_BYTES: usize = 4 << 20;

/// Cache of the lazy DFA of one pattern, per thread that matches with it (bytes). Over it,
/// matching falls back to the NFA simulation, still linear in the input; a smaller cache
/// gives up sooner on a pattern whose DFA would blow up (measured: the worst patterns end
/// sooner with 512 KiB than with the default 2 MiB).
pub const MAX_DFA_BYTES: usize = 512 << 10;

/// Compiled patterns kept at most; the cache starts over once it holds more.
const CACHED_PATTERNS: usize = 512;

/// A compiled pattern and the size of its automaton.
#[derive(Debug)]
pub struct Pattern {
    regex: Regex,
    states: usize,
}

impl Pattern {
    /// Whether the pattern matches somewhere in `text`.
    pub fn is_match(&self, text: &str) -> bool {
        self.regex.is_match(text)
    }

    /// The states of its automaton (Thompson NFA, without captures), at least one per
    /// character of the pattern: what matching costs per character of input in the worst
    /// case, where the lazy DFA gives way to the NFA simulation. `\pL` alone is 300 states,
    /// `a{500}` over 500.
    pub fn states(&self) -> usize {
        self.states
    }
}

type Cache = Mutex<HashMap<String, Result<Arc<Pattern>, String>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The compiled form of Go pattern `pattern` (unanchored, as Go's `MatchString` uses it),
/// from the cache when it was compiled before. The error says why it does not compile (a
/// syntax the `regex` crate lacks, or over [`MAX_COMPILED_BYTES`]).
pub fn compile(pattern: &str) -> Result<Arc<Pattern>, String> {
    let mut cached = cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(found) = cached.get(pattern) {
        return found.clone();
    }
    let translated = translate(pattern);
    let compiled = RegexBuilder::new(&translated)
        .octal(true)
        .size_limit(MAX_COMPILED_BYTES)
        .dfa_size_limit(MAX_DFA_BYTES)
        .build()
        .map(|regex| {
            let states = automaton_states(&translated).max(pattern.chars().count());
            Arc::new(Pattern { regex, states })
        })
        .map_err(|error| match error {
            regex::Error::CompiledTooBig(limit) => {
                format!("the pattern compiles to more than {limit} bytes")
            }
            other => other.to_string(),
        });
    if cached.len() >= CACHED_PATTERNS {
        cached.clear();
    }
    cached.insert(pattern.to_owned(), compiled.clone());
    compiled
}

/// The states of the pattern's Thompson NFA without captures, less the three every NFA has
/// (the empty pattern's); the size limit is the regex's, which already compiled it.
fn automaton_states(translated: &str) -> usize {
    use regex_automata::nfa::thompson::{Compiler, Config, WhichCaptures};
    Compiler::new()
        .syntax(regex_automata::util::syntax::Config::new().octal(true))
        .configure(
            Config::new()
                .which_captures(WhichCaptures::None)
                .nfa_size_limit(Some(MAX_COMPILED_BYTES)),
        )
        .build(translated)
        .map_or(usize::MAX, |nfa| nfa.states().len().saturating_sub(3))
}

/// A Go pattern rewritten in the `regex` crate's syntax with the same meaning.
pub fn translate(pattern: &str) -> String {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut i = 0;
    // Inside a bracketed class: where it started (to know its first character).
    let mut class_start: Option<usize> = None;
    while i < chars.len() {
        let c = chars[i];
        match (c, class_start) {
            ('\\', _) if i + 1 < chars.len() => {
                let next = chars[i + 1];
                i += 2;
                match next {
                    'Q' if class_start.is_none() => {
                        while i < chars.len() && !(chars[i] == '\\' && chars.get(i + 1) == Some(&'E')) {
                            out.push_str(&regex::escape(&chars[i].to_string()));
                            i += 1;
                        }
                        i += 2; // `\E`, or past the end
                    }
                    'd' | 'D' | 's' | 'S' | 'w' | 'W' => out.push_str(ascii_class(next)),
                    'b' if class_start.is_none() => out.push_str(r"(?-u:\b)"),
                    'B' if class_start.is_none() => out.push_str(r"(?-u:\B)"),
                    _ => {
                        out.push('\\');
                        out.push(next);
                    }
                }
                continue;
            }
            ('[', None) => {
                out.push('[');
                i += 1;
                if chars.get(i) == Some(&'^') {
                    out.push('^');
                    i += 1;
                }
                class_start = Some(i);
                // A `]` first in a class is a character in both dialects.
                if chars.get(i) == Some(&']') {
                    out.push_str(r"\]");
                    i += 1;
                }
                continue;
            }
            (']', Some(_)) => {
                class_start = None;
                out.push(']');
            }
            ('[', Some(_)) if chars.get(i + 1) == Some(&':') => {
                // `[:alpha:]` (ASCII in both): copied whole.
                match chars[i..].iter().skip(2).position(|&c| c == ']') {
                    Some(end) if end >= 2 && chars[i + 2 + end - 1] == ':' => {
                        out.extend(&chars[i..i + 3 + end]);
                        i += 3 + end;
                        continue;
                    }
                    _ => out.push_str(r"\["),
                }
            }
            ('{', None) if !is_repetition(&chars[i..]) => out.push_str(r"\{"),
            // Only whether it matches is asked: groups need not capture, and capturing
            // groups make the NFA simulation several times slower.
            ('(', None) => {
                let rest: String = chars[i + 1..].iter().take(3).collect();
                if !rest.starts_with('?') {
                    out.push_str("(?:");
                } else if rest.starts_with("?P<")
                    || (rest.starts_with("?<") && !rest.starts_with("?<=") && !rest.starts_with("?<!"))
                {
                    let name_end = chars[i..]
                        .iter()
                        .position(|&c| c == '>')
                        .map_or(chars.len(), |at| i + at);
                    out.push_str("(?:");
                    i = name_end + 1;
                    continue;
                } else {
                    out.push('(');
                }
            }
            ('[' | '&' | '~', Some(_)) => {
                out.push('\\');
                out.push(c);
            }
            ('-', Some(_)) if out.ends_with('-') && !out.ends_with("\\-") => out.push_str(r"\-"),
            _ => out.push(c),
        }
        i += 1;
    }
    out
}

/// Whether `{...` starts a counted repetition (`{2}`, `{2,}`, `{2,5}`); anywhere else Go
/// reads `{` as a character.
fn is_repetition(rest: &[char]) -> bool {
    let digits = |from: usize| rest[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let first = digits(1);
    if first == 0 {
        return false;
    }
    let mut at = 1 + first;
    if rest.get(at) == Some(&',') {
        at += 1 + digits(at + 1);
    }
    rest.get(at) == Some(&'}')
}

/// Go's Perl classes, which are ASCII, as bracketed classes (valid inside a class too, as a
/// nested one).
fn ascii_class(name: char) -> &'static str {
    match name {
        'd' => "[0-9]",
        'D' => "[^0-9]",
        's' => r"[\t\n\f\r ]",
        'S' => r"[^\t\n\f\r ]",
        'w' => "[0-9A-Za-z_]",
        _ => "[^0-9A-Za-z_]",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, text: &str) -> bool {
        compile(pattern).expect(pattern).is_match(text)
    }

    /// Go's answers: each case was run through `regexp.MatchString` of Go 1.27.3 (the
    /// toolchain that built this project's v1.36.2 control plane) and gave what is asserted.
    #[test]
    fn patterns_mean_what_they_mean_in_go() {
        // Perl classes are ASCII in Go: an Arabic-Indic digit is no \d, é no \w.
        assert!(!matches(r"^\d+$", "٣"));
        assert!(matches(r"^\D$", "٣"));
        assert!(!matches(r"^\w+$", "é"));
        assert!(matches(r"^\W$", "é"));
        assert!(!matches(r"^\s$", "\u{a0}"));
        assert!(!matches(r"^\s$", "\u{b}"), "Go's \\s has no vertical tab");
        assert!(matches(r"^[\d]+$", "42"));
        assert!(!matches(r"^[\d]+$", "٣"));
        assert!(matches(r"^[^\d]$", "x"));
        // ASCII word boundaries: é is no word character.
        assert!(matches(r"\bx", "éx"));
        assert!(!matches(r"\Bx", "éx"));
        // Unicode where Go has it too.
        assert!(matches(r"^\pL+$", "été"));
        assert!(matches(r"^.$", "é"));
        // Quoted text, octal escapes, literal brackets and operators inside classes.
        assert!(matches(r"^\Q(a+)\E$", "(a+)"));
        assert!(matches(r"^\101$", "A"));
        assert!(matches(r"^[a[]+$", "a[["));
        assert!(matches(r"^[a&&b]+$", "a&b"));
        assert!(matches(r"^[+--]+$", "+,-"));
        assert!(matches(r"^[~~]$", "~"));
        assert!(matches(r"^[]a]+$", "]a"));
        assert!(matches(r"^[[:alpha:]]+$", "abc"));
        // A brace that starts no repetition is a character.
        assert!(matches(r"^x{,3}$", "x{,3}"));
        assert!(matches(r"^x{a}{$", "x{a}{"));
        assert!(matches(r"^x{2}y{1,}z{1,2}$", "xxyzz"));
        // Groups, named or not, still group.
        assert!(matches(r"^(ab)+(?P<n>c|d)(?<m>e)$", "ababde"));
        assert_eq!(translate(r"(a)(?:b)(?P<x>c)(?i)\(d"), r"(?:a)(?:b)(?:c)(?i)\(d");
        assert!(!matches(r"^[[:alpha:]]+$", "é"));
    }

    #[test]
    fn a_pattern_is_compiled_once_and_bounded() {
        let first = compile(r"^[a-z]+\d$").expect("compiles");
        let second = compile(r"^[a-z]+\d$").expect("compiles");
        assert!(Arc::ptr_eq(&first, &second), "the second comes from the cache");
        assert!(first.states() >= r"^[a-z]+\d$".len());
        assert!(compile("a{500}").expect("compiles").states() >= 500);
        assert!(compile(r"\pL").expect("compiles").states() >= 250);
        let huge = compile(r"(\pL{100}){100}").expect_err("too big");
        assert!(huge.contains("more than"), "{huge}");
        assert!(compile("(").is_err());
    }
}
