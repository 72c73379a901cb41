//! `crd-lifecycle migrate`: a progress bar on a terminal, periodic lines otherwise, and a
//! final summary.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{Checkpoint, Counts, Observer, Rate, Target};
use crate::sync::lock;

/// How often the plain (non-terminal) progress line is printed.
const LINE_INTERVAL: Duration = Duration::from_secs(5);

/// The window the shown rate is measured over.
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Shows progress on stderr.
pub struct ProgressDisplay {
    output: Output,
    rate: Mutex<Rate>,
}

enum Output {
    Bar(ProgressBar),
    Lines { crd: String, last: Mutex<Instant> },
}

impl ProgressDisplay {
    /// A bar when stderr is a terminal, plain lines otherwise.
    pub fn for_stderr(crd: &str) -> Self {
        // The rate and ETA are our own (measured over a window of this process' work), not
        // indicatif's, which a resumed count or a restart would throw off.
        let output = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{spinner} {prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} objects, {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(crd.to_owned());
            bar.enable_steady_tick(Duration::from_millis(200));
            Output::Bar(bar)
        } else {
            Output::Lines {
                crd: crd.to_owned(),
                last: Mutex::new(Instant::now()),
            }
        };
        let mut rate = Rate::new(RATE_WINDOW);
        rate.reset(Instant::now(), 0);
        ProgressDisplay {
            output,
            rate: Mutex::new(rate),
        }
    }

    /// Removes the bar before the summary is printed.
    pub fn finish(&self) {
        if let Output::Bar(bar) = &self.output {
            bar.finish_and_clear();
        }
    }

    fn note(&self, text: &str) {
        match &self.output {
            Output::Bar(bar) => bar.println(text),
            Output::Lines { crd, .. } => eprintln!("migrate {crd}: {text}"),
        }
    }
}

/// `40 objects/s, ETA 1m 15s`: the rate over the last seconds, and the time left at it.
pub fn rate_line(counts: &Counts, total: Option<u64>, per_second: f64) -> String {
    let eta = match total {
        Some(total) if per_second >= 0.01 => {
            let seconds = (total.saturating_sub(counts.done()) as f64 / per_second).round() as u64;
            let (minutes, seconds) = (seconds / 60, seconds % 60);
            if minutes > 0 {
                format!("ETA {minutes}m {seconds:02}s")
            } else {
                format!("ETA {seconds}s")
            }
        }
        _ => "ETA ?".to_owned(),
    };
    format!("{per_second:.0} objects/s, {eta}")
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
    fn started(&self, _target: &Target, counts: &Counts) {
        lock(&self.rate).reset(Instant::now(), counts.done());
    }

    fn progress(&self, counts: &Counts, total: Option<u64>) {
        let now = Instant::now();
        let per_second = {
            let mut rate = lock(&self.rate);
            rate.record(now, counts.done());
            rate.per_second(now)
        };
        match &self.output {
            Output::Bar(bar) => {
                if let Some(total) = total {
                    bar.set_length(total.max(counts.done()));
                }
                bar.set_position(counts.done());
                let mut message = rate_line(counts, total, per_second);
                if counts.failed > 0 {
                    message.push_str(&format!(" ({} failed)", counts.failed));
                }
                bar.set_message(message);
            }
            Output::Lines { crd, last } => {
                let mut last = lock(last);
                if last.elapsed() >= LINE_INTERVAL {
                    *last = now;
                    eprintln!(
                        "migrate {crd}: {}, {}",
                        progress_line(counts, total),
                        rate_line(counts, total, per_second)
                    );
                }
            }
        }
    }

    fn checkpoint(&self, _checkpoint: &Checkpoint, _counts: &Counts) {}

    fn restarted(&self, reason: &str) {
        self.note(&format!("restarting: {reason}"));
    }

    fn continued(&self, reason: &str) {
        self.note(reason);
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

    #[test]
    fn rate_lines() {
        let counts = Counts {
            listed: 1000,
            rewritten: 1000,
            skipped: 0,
            failed: 0,
        };
        assert_eq!(rate_line(&counts, Some(4000), 40.0), "40 objects/s, ETA 1m 15s");
        assert_eq!(rate_line(&counts, Some(1200), 40.0), "40 objects/s, ETA 5s");
        assert_eq!(rate_line(&counts, None, 40.0), "40 objects/s, ETA ?");
        assert_eq!(rate_line(&counts, Some(4000), 0.0), "0 objects/s, ETA ?");
    }
}
