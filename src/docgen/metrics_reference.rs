//! The metrics reference, read from the registry the operator serves on `/metrics`: every
//! metric's name, type, labels and help as the encoded text gives them.

use std::time::Duration;

use crd_lifecycle::controller::metrics::{CrdLabels, JobLabels, Metrics, MigrationResultLabels};
use crd_lifecycle::webhook::ReviewResult;

use super::markdown::{row, wrap};

/// One exported metric.
#[derive(Debug, Default)]
struct Exported {
    name: String,
    kind: String,
    unit: Option<String>,
    help: String,
    labels: Vec<String>,
}

/// The page `reference/metrics.md`.
pub(super) fn render() -> String {
    let mut page = String::from("# Metrics reference\n\n");
    page.push_str(&super::generated_from(
        "the operator's metrics registry (`src/controller/metrics.rs`, `src/webhook/metrics.rs`)",
    ));
    page.push('\n');
    page.push_str(&wrap(
        "`crd-lifecycle run` serves these on `/metrics` (OpenMetrics text) at `--metrics-addr`; \
         what they mean in operation is in [how the controller works](../concepts/controller.md#metrics) \
         and [alerts](../guides/alerts.md). Counters are named with their `_total` suffix, as \
         Prometheus stores them.",
    ));
    page.push_str("\n\n| metric | type | labels | meaning |\n| --- | --- | --- | --- |\n");
    for metric in exported(&with_every_series()) {
        let name = match metric.kind.as_str() {
            "counter" => format!("{}_total", metric.name),
            _ => metric.name.clone(),
        };
        let unit = metric.unit.map(|u| format!(" (unit: {u})")).unwrap_or_default();
        page.push_str(&row(&[
            format!("`{name}`"),
            format!("{}{unit}", metric.kind),
            metric
                .labels
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", "),
            metric.help,
        ]));
    }
    page
}

/// The registry with a series in every family: a family without one is not encoded with its
/// labels. The same calls the controller, the migrations and the webhook make.
fn with_every_series() -> Metrics {
    let metrics = Metrics::default();
    let crd = CrdLabels { crd: String::new() };
    let job = JobLabels {
        crd: String::new(),
        job: String::new(),
    };
    let result = MigrationResultLabels {
        crd: String::new(),
        result: String::new(),
    };
    metrics.record_failure("");
    metrics.record_transition("", "", "");
    metrics.set_next_transition("", Some(jiff::Timestamp::UNIX_EPOCH));
    metrics.set_blocked("", &["AwaitingMigration"]);
    metrics.set_state("", Some("Ready"));
    metrics.objects_migrated.get_or_create(&crd).inc();
    metrics.objects_failed.get_or_create(&crd).inc();
    metrics.objects_repaired.get_or_create(&crd).inc();
    metrics.objects_remaining.get_or_create(&job).set(0);
    metrics.job_objects_done.get_or_create(&job).set(0);
    metrics.job_objects_expected.get_or_create(&job).set(0);
    metrics.job_objects_per_second.get_or_create(&job).set(0.0);
    metrics.migrations.get_or_create(&result).inc();
    metrics.managed_fields_cleanups.get_or_create(&result).inc();
    metrics
        .webhook
        .observe_review("", ReviewResult::success, Duration::ZERO);
    metrics
}

/// The metrics of the encoded text, in registration order.
fn exported(metrics: &Metrics) -> Vec<Exported> {
    let mut found: Vec<Exported> = Vec::new();
    for line in metrics.encode().lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            found.push(Exported {
                name: name.to_owned(),
                help: help.replace("\\n", " "),
                ..Exported::default()
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let (Some(metric), Some((_, kind))) = (found.last_mut(), rest.split_once(' ')) {
                metric.kind = kind.to_owned();
            }
        } else if let Some(rest) = line.strip_prefix("# UNIT ") {
            if let (Some(metric), Some((_, unit))) = (found.last_mut(), rest.split_once(' ')) {
                metric.unit = Some(unit.to_owned());
            }
        } else if let (Some(metric), Some((_, labels))) = (found.last_mut(), line.split_once('{')) {
            for pair in labels.split_once('}').map_or("", |(l, _)| l).split(',') {
                let Some((label, _)) = pair.split_once('=') else {
                    continue;
                };
                // A histogram's bucket bound is not one of its labels.
                if label != "le" && !metric.labels.iter().any(|l| l == label) {
                    metric.labels.push(label.to_owned());
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family has a series, so that no metric's labels are missing from the page: a
    /// new family must get one in `with_every_series`.
    #[test]
    fn every_metric_is_encoded_with_a_sample() {
        let metrics = with_every_series();
        let text = metrics.encode();
        for metric in exported(&metrics) {
            let sampled = text
                .lines()
                .any(|l| !l.starts_with('#') && l.starts_with(&metric.name));
            assert!(
                sampled,
                "{} has no series: add one in with_every_series",
                metric.name
            );
        }
    }

    #[test]
    fn the_page_names_metrics_with_their_labels() {
        let page = render();
        assert!(
            page.contains("| `crd_lifecycle_reconciles_total` | counter |"),
            "{page}"
        );
        assert!(page.contains("`crd`, `job`"), "{page}");
        assert!(page.contains("crd_lifecycle_webhook_open_connections"), "{page}");
    }
}
