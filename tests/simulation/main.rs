//! A deterministic, adversarial simulation of the controller (FoundationDB-style, with Sieve's
//! three plans: crashes at any point, stale views, other writers), checked against the fake
//! apiserver's storage after every step.
//!
//! Each seed draws a workload and a fault schedule (`workload`), runs the real controller
//! against the fake on tokio's paused clock and one thread (`world`), and checks the
//! invariants (`invariants`; `webhook` for the conversion webhook's certificates and CA
//! bundle, on the seeds whose replicas serve it). A violation prints the seed, the shortest
//! fault schedule found that still breaks it, the trace leading to it, and the command that
//! replays it.
//!
//! - `cargo test --test simulation`: `SIM_SEEDS` seeds (default 500) from `SIM_FIRST` (0), on
//!   every core (`SIM_THREADS` threads, one seed each at a time; the outcomes do not depend on it).
//! - `SIM_SEED=N cargo test --test simulation`: replays seed N and prints its whole trace;
//!   `SIM_FAULTS=0,3` keeps only those faults of its schedule (what the shrinker printed);
//!   `SIM_LOG=info` adds the controller's log, `SIM_REQUESTS=1` every request it sent.
//! - `SIM_FAULT=TEXT` runs only the seeds whose schedule has a fault whose description
//!   contains TEXT (e.g. `SIM_FAULT="flips the storage version back"`).
//! - `SIM_KEEP_GOING=1` runs every seed of the budget even after a violation;
//!   `SIM_NO_SHRINK=1` reports a violation without shrinking its schedule.
//! - `scripts/mutants.sh`: every known bug (`tests/mutants/*.patch`) must be caught.

#[path = "../support/apiserver/mod.rs"]
mod apiserver;
mod invariants;
mod webhook;
mod workload;
mod world;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

/// Seeds of the CI budget that reproduce a finding still open, each with the words its first
/// violation contains and the finding. They are reported on every run, never hidden; any
/// other violation fails the run (and so does a listed seed that stops reproducing it, so
/// that the list is kept true).
const KNOWN_OPEN: &[(u64, &str, &str)] = &[];

/// Every this many seeds, the seed runs twice: the two digests must match (replay is exact).
const REPLAY_EVERY: u64 = 25;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn main() -> ExitCode {
    // `cargo test -- --list` (and nextest) ask for the tests' names.
    if std::env::args().any(|a| a == "--list") {
        println!("simulation: test");
        return ExitCode::SUCCESS;
    }
    if let Some(seed) = env_u64("SIM_SEED") {
        return replay(seed);
    }
    let seeds = env_u64("SIM_SEEDS").unwrap_or(500);
    let first = env_u64("SIM_FIRST").unwrap_or(0);
    let started = Instant::now();
    let mut steps = 0;
    let mut faults: BTreeMap<&str, usize> = ["stale", "crash", "writer", "skew"].map(|k| (k, 0)).into();
    let mut failed = Vec::new();
    let mut known_open = 0;
    let mut replays = 0;
    let mut ran = 0;
    let mut stopped = None;
    // Seeds run on every core (`SIM_THREADS` to choose), each on a runtime and thread of its
    // own: a seed's run depends on nothing but its seed, so the outcomes are the same as one
    // after the other; they are read here in seed order.
    let threads = env_u64("SIM_THREADS")
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
        .max(1);
    let next = AtomicU64::new(first);
    // No seed past this one starts (set at the first violation kept).
    let last = AtomicU64::new(first + seeds);
    let (sender, results) = mpsc::channel::<(u64, Option<Ran>)>();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let sender = sender.clone();
            let (next, last) = (&next, &last);
            scope.spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= last.load(Ordering::SeqCst) {
                        break;
                    }
                    // A panic is a finding too: reported with its seed, and no later seed starts.
                    let ran = std::panic::catch_unwind(|| run_seed(seed)).unwrap_or_else(|_| {
                        last.fetch_min(seed + 1, Ordering::SeqCst);
                        println!("simulation: seed {seed} PANICKED (replay: SIM_SEED={seed} cargo test --test simulation)");
                        Some(Ran::panicked(seed))
                    });
                    if sender.send((seed, ran)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(sender);
        let mut waiting: BTreeMap<u64, Option<Ran>> = BTreeMap::new();
        let mut expected = first;
        for (seed, result) in &results {
            waiting.insert(seed, result);
            while let Some(result) = waiting.remove(&expected) {
                let seed = expected;
                expected += 1;
                let Some(result) = result else { continue };
                ran += 1;
                steps += result.outcome.steps;
                if result.replayed {
                    replays += 1;
                }
                if result.replay_differs {
                    failed.push(seed);
                    continue;
                }
                for kind in &result.outcome.faults {
                    *faults.entry(kind).or_default() += 1;
                }
                let known = KNOWN_OPEN.iter().find(|(known, _, _)| *known == seed);
                if let Some((_, words, finding)) = known {
                    if result
                        .outcome
                        .violations
                        .first()
                        .is_some_and(|v| v.contains(words))
                    {
                        println!("simulation: seed {seed} reproduces a known open finding ({finding})");
                        known_open += 1;
                        continue;
                    }
                    println!(
                        "simulation: seed {seed} no longer reproduces its known open finding: update KNOWN_OPEN"
                    );
                    failed.push(seed);
                    continue;
                }
                if !result.outcome.violations.is_empty() {
                    // One violation is enough to act on; SIM_KEEP_GOING=1 counts them all.
                    // No later seed starts while this one is shrunk and reported.
                    let stop = std::env::var("SIM_KEEP_GOING").is_err();
                    if stop {
                        last.store(seed, Ordering::SeqCst);
                    }
                    // A panic was printed where it happened (shrinking would panic again).
                    if !result.panicked {
                        report(seed, &result.draw, &result.outcome);
                    }
                    failed.push(seed);
                    if stop {
                        stopped = Some(seed);
                        return;
                    }
                }
            }
        }
    });
    if let Some(seed) = stopped {
        println!(
            "simulation: stopped at the first violating seed ({} seeds run)",
            seed - first + 1
        );
        summary(ran, steps, &faults, failed.len(), started);
        println!(
            "simulation: first violation at seed {seed} after {} seeds",
            seed - first + 1
        );
        return ExitCode::FAILURE;
    }
    if known_open > 0 {
        println!(
            "simulation: {known_open} seed(s) reproduced a known open finding (KNOWN_OPEN in tests/simulation/main.rs)"
        );
    }
    println!("simulation: {replays} seeds run twice, each replayed identically unless listed above");
    summary(ran, steps, &faults, failed.len(), started);
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("simulation: violating seeds {failed:?}");
        ExitCode::FAILURE
    }
}

/// One seed's run, as a worker thread hands it over.
struct Ran {
    draw: workload::Draw,
    outcome: world::Outcome,
    /// It ran twice (every `REPLAY_EVERY` seeds).
    replayed: bool,
    /// The second run's digest differed (reported here, as it happened).
    replay_differs: bool,
    /// The run panicked (`outcome` holds only a violation that says so).
    panicked: bool,
}

impl Ran {
    /// A seed whose run panicked: a violation that says so.
    fn panicked(seed: u64) -> Ran {
        Ran {
            draw: workload::draw(seed),
            outcome: world::Outcome {
                violations: vec![format!("seed {seed}: the run panicked (its message is above)")],
                trace: Vec::new(),
                steps: 0,
                digest: 0,
                requests: Vec::new(),
                faults: Vec::new(),
            },
            replayed: false,
            replay_differs: false,
            panicked: true,
        }
    }
}

/// Runs `seed` (and again, every `REPLAY_EVERY` seeds, to check the replay is exact), or
/// nothing when `SIM_FAULT` aims the run at seeds without that fault.
fn run_seed(seed: u64) -> Option<Ran> {
    let draw = workload::draw(seed);
    // Aims a run at one fault: only the seeds whose schedule has a fault described so.
    if let Ok(only) = std::env::var("SIM_FAULT") {
        if !draw
            .faults
            .iter()
            .any(|(_, f)| f.to_string().contains(only.as_str()))
        {
            return None;
        }
        println!("simulation: seed {seed}");
    }
    let seed_started = Instant::now();
    let outcome = world::run(seed, &draw, &|_| true);
    if std::env::var("SIM_PROFILE").is_ok() {
        println!(
            "simulation: seed {seed}: {} steps in {:.1}s",
            outcome.steps,
            seed_started.elapsed().as_secs_f64()
        );
    }
    let replayed = seed.is_multiple_of(REPLAY_EVERY);
    let mut replay_differs = false;
    if replayed {
        let again = world::run(seed, &draw, &|_| true);
        if again.digest != outcome.digest {
            println!("simulation: seed {seed} did not replay identically");
            where_runs_part(&outcome, &again);
            replay_differs = true;
        }
    }
    Some(Ran {
        draw,
        outcome,
        replayed,
        replay_differs,
        panicked: false,
    })
}

fn summary(seeds: u64, steps: u64, faults: &BTreeMap<&str, usize>, violations: usize, started: Instant) {
    println!(
        "simulation: {seeds} seeds, {steps} steps, faults {{stale: {}, crash: {}, writer: {}, skew: {}}}, violations {violations} ({:.0}s)",
        faults["stale"],
        faults["crash"],
        faults["writer"],
        faults["skew"],
        started.elapsed().as_secs_f64()
    );
    println!(
        "simulation: {} passed, {violations} failed",
        seeds as usize - violations
    );
}

/// Prints a violating seed: the violation, its shrunk fault schedule, the trace, the
/// replay command.
fn report(seed: u64, draw: &workload::Draw, outcome: &world::Outcome) {
    println!("simulation: seed {seed} VIOLATED: {}", outcome.violations[0]);
    // SIM_NO_SHRINK=1 (the mutants' script): the whole schedule, no shrinking.
    let kept = if std::env::var("SIM_NO_SHRINK").is_ok() {
        (0..draw.faults.len()).collect()
    } else {
        shrink(seed, draw)
    };
    let shrunk = world::run(seed, draw, &|i| kept.contains(&i));
    println!(
        "simulation: seed {seed}: the faults that still break it ({} of {}):",
        kept.len(),
        draw.faults.len()
    );
    for i in &kept {
        let (at, fault) = &draw.faults[*i];
        println!("  #{i} at {at}s: {fault}");
    }
    let trace = if shrunk.violations.is_empty() {
        outcome
    } else {
        &shrunk
    };
    let end = trace
        .trace
        .iter()
        .position(|l| l.contains("VIOLATION"))
        .map_or(trace.trace.len(), |p| p + 1);
    let begin = end.saturating_sub(60);
    println!("simulation: seed {seed}: the trace up to the violation:");
    for line in &trace.trace[begin..end] {
        println!("  {line}");
    }
    let faults: Vec<String> = kept.iter().map(ToString::to_string).collect();
    println!(
        "simulation: replay with: SIM_SEED={seed} SIM_FAULTS={} cargo test --test simulation",
        if faults.is_empty() {
            "none".to_owned()
        } else {
            faults.join(",")
        }
    );
}

/// The fewest faults of the schedule (greedily, one at a time) that still give a
/// violation: the shortest trace a person has to read.
fn shrink(seed: u64, draw: &workload::Draw) -> Vec<usize> {
    let mut kept: Vec<usize> = (0..draw.faults.len()).collect();
    let mut i = 0;
    while i < kept.len() {
        let candidate: Vec<usize> = kept.iter().copied().filter(|k| *k != kept[i]).collect();
        let outcome = world::run(seed, draw, &|f| candidate.contains(&f));
        if outcome.violations.is_empty() {
            i += 1;
        } else {
            kept = candidate;
        }
    }
    kept
}

/// Where two runs of one seed first differ, if they do.
fn where_runs_part(one: &world::Outcome, other: &world::Outcome) {
    let first = |a: &[String], b: &[String]| a.iter().zip(b).position(|(x, y)| x != y);
    if let Some(i) = first(&one.trace, &other.trace) {
        println!(
            "  the traces part at line {i}: {:?} / {:?}",
            one.trace[i], other.trace[i]
        );
    }
    if let Some(i) = first(&one.requests, &other.requests) {
        println!(
            "  the requests part at #{i}: {:?} / {:?}",
            one.requests[i], other.requests[i]
        );
    }
}

fn replay(seed: u64) -> ExitCode {
    // SIM_LOG=debug: the controller's own log (tracing), interleaved with the trace.
    if let Ok(filter) = std::env::var("SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .without_time()
            .init();
    }
    let draw = workload::draw(seed);
    let keep: Option<Vec<usize>> = std::env::var("SIM_FAULTS")
        .ok()
        .map(|list| list.split(',').filter_map(|f| f.trim().parse().ok()).collect());
    let keep_fn = |i: usize| keep.as_ref().is_none_or(|k| k.contains(&i));
    println!("simulation: seed {seed}: {:?}", draw.workload);
    for (i, (at, fault)) in draw.faults.iter().enumerate() {
        let mark = if keep_fn(i) { "" } else { " (left out)" };
        println!("  fault #{i} at {at}s: {fault}{mark}");
    }
    let outcome = world::run(seed, &draw, &keep_fn);
    for line in &outcome.trace {
        println!("  {line}");
    }
    let again = world::run(seed, &draw, &keep_fn);
    where_runs_part(&outcome, &again);
    println!(
        "simulation: seed {seed}: {} steps, trace digest {:016x} ({})",
        outcome.steps,
        outcome.digest,
        if again.digest == outcome.digest {
            "replayed identically"
        } else {
            "a second run differed"
        }
    );
    if outcome.violations.is_empty() {
        println!("simulation: seed {seed}: no violation");
        println!("simulation: 1 passed, 0 failed");
        ExitCode::SUCCESS
    } else {
        println!("simulation: 0 passed, 1 failed");
        ExitCode::FAILURE
    }
}
