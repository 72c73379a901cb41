//! `crd-lifecycle migrate`: a progress bar on a terminal, periodic lines otherwise, and a
//! final summary.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{Checkpoint, Counts, Observer};

/// How often the plain (non-terminal) progress line is printed.
const LINE_INTERVAL: Duration = Duration::from_secs(5);

/// Shows progress on stderr.
pub enum ProgressDisplay {
    Bar(ProgressBar),
    Lines {
        crd: String,
        started: Instant,
        last: Mutex<Instant>,
    },
}

impl ProgressDisplay {
    /// A bar when stderr is a terminal, plain lines otherwise.
    pub fn for_stderr(crd: &str) -> Self {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{spinner} {prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} objects, {per_sec}, ETA {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(crd.to_owned());
            bar.enable_steady_tick(Duration::from_millis(200));
            ProgressDisplay::Bar(bar)
        } else {
            let now = Instant::now();
            ProgressDisplay::Lines {
                crd: crd.to_owned(),
                started: now,
                last: Mutex::new(now),
            }
        }
    }

    /// Removes the bar before the summary is printed.
    pub fn finish(&self) {
        if let ProgressDisplay::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// `1200/5000 objects (1100 rewritten, 90 skipped, 10 failed)`.
pub fn progress_line(counts: &Counts, total: Option<u64>) -> String {
    let total = total.map_or_else(|| "?".to_owned(), |t| t.to_string());
    format!(
        "{}/{total} objects ({} rewritten, {} skipped, {} failed)",
        counts.done(),
        counts.rewritten,
        counts.skipped,
        counts.failed
    )
}

impl Observer for ProgressDisplay {
    fn progress(&self, counts: &Counts, total: Option<u64>) {
        match self {
            ProgressDisplay::Bar(bar) => {
                if let Some(total) = total {
                    bar.set_length(total.max(counts.done()));
                }
                bar.set_position(counts.done());
                if counts.failed > 0 {
                    bar.set_message(format!("({} failed)", counts.failed));
                }
            }
            ProgressDisplay::Lines { crd, started, last } => {
                let mut last = crate::sync::lock(last);
                if last.elapsed() >= LINE_INTERVAL {
                    *last = Instant::now();
                    let rate = counts.done() as f64 / started.elapsed().as_secs_f64().max(0.001);
                    eprintln!(
                        "migrate {crd}: {}, {rate:.0} objects/s",
                        progress_line(counts, total)
                    );
                }
            }
        }
    }

    fn checkpoint(&self, _checkpoint: &Checkpoint, _counts: &Counts) {}

    fn restarted(&self, reason: &str) {
        match self {
            ProgressDisplay::Bar(bar) => bar.println(format!("restarting: {reason}")),
            ProgressDisplay::Lines { crd, .. } => eprintln!("migrate {crd}: restarting: {reason}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines() {
        let counts = Counts {
            listed: 1300,
            rewritten: 1100,
            skipped: 90,
            failed: 10,
        };
        assert_eq!(
            progress_line(&counts, Some(5000)),
            "1200/5000 objects (1100 rewritten, 90 skipped, 10 failed)"
        );
        assert_eq!(
            progress_line(&counts, None),
            "1200/? objects (1100 rewritten, 90 skipped, 10 failed)"
        );
    }
}
