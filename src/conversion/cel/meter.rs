//! The cost budget: metered while an expression runs, not estimated from its text.

/// Cost units one evaluation may use, as the apiserver's per-call limit for CRD validation
/// rules (`k8s.io/apiserver/pkg/apis/cel.PerCallLimit`). One unit is one step of the
/// evaluator (a node, an element of a list built, copied or compared, or 10 bytes of a
/// string built or scanned: cel-go's `StringTraversalCostFactor` of 0.1); `matches` costs
/// the traversal of its input times the states of the pattern's automaton.
pub const PER_CALL_COST_LIMIT: u64 = 1_000_000;

/// Cost units all evaluations for one ConversionReview may use together (every object,
/// every field, both directions).
pub const PER_REVIEW_COST_LIMIT: u64 = 10_000_000;

/// Longest string an expression may build (bytes).
pub const MAX_STRING_BYTES: usize = 1 << 20;

/// Most elements a list or map an expression builds may have.
pub const MAX_LIST_ELEMENTS: usize = 100_000;

/// Bytes of a string that cost one unit to build or scan (cel-go's
/// `StringTraversalCostFactor`, 0.1 per byte, rounded up).
const BYTES_PER_UNIT: u64 = 10;

/// Units `matches` costs per state of the pattern's automaton and traversal unit (10 bytes)
/// of its text. Where the lazy DFA would blow up (`(a|b)*a(a|b){20}c` over random `a`s and
/// `b`s), the regex engine falls back to simulating the NFA, which visits every state for
/// every byte: about 17 ns per state and byte in a release build on this project's 2-core
/// machine. At 2 units, the 1,000,000 units of one evaluation allow 5 million state-bytes,
/// under 0.1 s, about what as many units of the evaluator's other steps take.
pub const UNITS_PER_STATE: u64 = 2;

/// What is left of a review's cost budget; each evaluation draws on it.
#[derive(Debug, Clone)]
pub struct Budget {
    /// Units left for the whole review.
    pub remaining: u64,
    /// Units one evaluation may use at most.
    pub per_call: u64,
    /// Units the whole review had.
    pub per_review: u64,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget::new(PER_REVIEW_COST_LIMIT, PER_CALL_COST_LIMIT)
    }
}

impl Budget {
    /// A budget for one review of these limits.
    pub fn new(per_review: u64, per_call: u64) -> Budget {
        Budget {
            remaining: per_review,
            per_call,
            per_review,
        }
    }
}

/// Why an evaluation stopped.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Stop {
    /// An error of the expression on this value (CEL's error value; `||` and `&&` may
    /// absorb it).
    Error(String),
    /// Over a limit: never absorbed, the evaluation ends.
    Limit(String),
}

impl Stop {
    pub(super) fn error(message: impl Into<String>) -> Stop {
        Stop::Error(message.into())
    }

    pub(super) fn message(self) -> String {
        match self {
            Stop::Error(message) | Stop::Limit(message) => message,
        }
    }
}

/// The meter of one evaluation.
#[derive(Debug)]
pub(super) struct Meter {
    used: u64,
    /// Units this evaluation may use: the per-call limit, or what the review has left.
    limit: u64,
    /// Whether the limit is the review's rather than the per-call one (for the message).
    review_bound: bool,
    per_call: u64,
    per_review: u64,
}

impl Meter {
    pub(super) fn new(budget: &Budget) -> Meter {
        Meter {
            used: 0,
            limit: budget.per_call.min(budget.remaining),
            review_bound: budget.remaining < budget.per_call,
            per_call: budget.per_call,
            per_review: budget.per_review,
        }
    }

    pub(super) fn used(&self) -> u64 {
        self.used
    }

    pub(super) fn charge(&mut self, units: u64) -> Result<(), Stop> {
        self.used = self.used.saturating_add(units);
        if self.used > self.limit {
            return Err(Stop::Limit(if self.review_bound {
                format!(
                    "the review's cost budget of {} units is used up (see the conversion limits in docs/src/concepts/conversion.md)",
                    self.per_review
                )
            } else {
                format!(
                    "the expression exceeded its cost limit of {} units per evaluation",
                    self.per_call
                )
            }));
        }
        Ok(())
    }

    pub(super) fn charge_bytes(&mut self, bytes: usize) -> Result<(), Stop> {
        self.charge(Meter::bytes_units(bytes))
    }

    pub(super) fn bytes_units(bytes: usize) -> u64 {
        (bytes as u64).div_ceil(BYTES_PER_UNIT)
    }

    /// What `text.matches(pattern)` costs, as cel-go charges it (`runtimecost.go`): the
    /// traversal of the text (plus one, so that an empty text still costs the pattern) times
    /// the pattern's size. cel-go guesses that size as a quarter of the pattern's length;
    /// here it is [`UNITS_PER_STATE`] for each state of the automaton
    /// (`re2::Pattern::states`), so that no pattern runs longer than its cost says
    /// (`\pL{100}` is short but has thousands of states).
    pub(super) fn matches_units(text_bytes: usize, states: usize) -> u64 {
        Meter::bytes_units(text_bytes.saturating_add(1))
            .saturating_mul(states.max(1) as u64)
            .saturating_mul(UNITS_PER_STATE)
    }

    /// Allows `units` more: writing out a result as large as the input is not the
    /// expression's cost (`self` on a large field), only what it adds is.
    pub(super) fn allow(&mut self, units: u64) {
        self.limit = self.limit.saturating_add(units);
    }

    pub(super) fn charge_elements(&mut self, elements: usize) -> Result<(), Stop> {
        self.charge(elements as u64)
    }

    /// Refuses, before it is allocated, a string longer than `MAX_STRING_BYTES`, and charges
    /// building it.
    pub(super) fn build_string(&mut self, bytes: u128) -> Result<usize, Stop> {
        if bytes > MAX_STRING_BYTES as u128 {
            return Err(Stop::Limit(format!(
                "the expression would build a string of {bytes} bytes; at most {MAX_STRING_BYTES} are allowed"
            )));
        }
        let bytes = bytes as usize;
        self.charge_bytes(bytes)?;
        Ok(bytes)
    }

    /// Refuses, before it is allocated, a list or map over `MAX_LIST_ELEMENTS`, and charges
    /// building it.
    pub(super) fn build_list(&mut self, elements: u128) -> Result<usize, Stop> {
        if elements > MAX_LIST_ELEMENTS as u128 {
            return Err(Stop::Limit(format!(
                "the expression would build a list or map of {elements} elements; at most {MAX_LIST_ELEMENTS} are allowed"
            )));
        }
        let elements = elements as usize;
        self.charge_elements(elements)?;
        Ok(elements)
    }
}
