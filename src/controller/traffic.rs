//! The traffic gate's eyes: samples the apiserver's `/metrics` and notes when requests to a
//! watched (group, version, resource) happened.
//!
//! `apiserver_request_total{group,version,resource,...}` counts every request the apiserver
//! answered; when the sum for a version moves between two samples, a request happened
//! between them. The controller and the migrator only ever call a CRD's storage version
//! (never a version being unserved: the storage version must stay served), so whatever
//! moves the counters of a version about to be unserved is a client. Limits: counters are
//! per apiserver instance (with several, each sample may come from another one, which only
//! makes the gate wait longer, while requests to an instance that is never sampled are
//! missed), and the window starts again when the controller restarts.

use crate::sync::lock;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use kube::Client;
use tracing::warn;

use crate::lifecycle::TrafficObservation;

/// (group, version, resource).
pub type ResourceVersion = (String, String, String);

/// Request counts and deprecated-API marks from one `/metrics` text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSample {
    /// Sum of `apiserver_request_total` over every other label.
    pub requests: BTreeMap<ResourceVersion, f64>,
    /// `apiserver_requested_deprecated_apis` series present with value 1.
    pub deprecated_requested: BTreeSet<ResourceVersion>,
}

/// Parses the Prometheus text format for the two metrics the gate reads.
pub fn parse_metrics(text: &str) -> MetricsSample {
    let mut sample = MetricsSample::default();
    for line in text.lines() {
        let line = line.trim();
        let (name, rest) = match line.split_once('{') {
            Some(parts) => parts,
            None => continue,
        };
        if name != "apiserver_request_total" && name != "apiserver_requested_deprecated_apis" {
            continue;
        }
        let Some((labels, value)) = split_labels(rest) else {
            continue;
        };
        let value: f64 = match value.split_whitespace().next().and_then(|v| v.parse().ok()) {
            Some(value) => value,
            None => continue,
        };
        let label = |key: &str| {
            labels
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let key = (label("group"), label("version"), label("resource"));
        if name == "apiserver_request_total" {
            *sample.requests.entry(key).or_default() += value;
        } else if value >= 1.0 {
            sample.deprecated_requested.insert(key);
        }
    }
    sample
}

/// Splits `k="v",k2="v2"} 12` into the labels and what follows the closing brace.
fn split_labels(text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after_key) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after_key.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                other => value.push(other),
            }
        };
        labels.push((key.trim().to_owned(), value));
        rest = &after_key[end + 1..];
    }
}

#[derive(Clone, Debug)]
struct Watch {
    observation: Option<TrafficObservation>,
    last_total: f64,
    deprecated_seen: bool,
}

/// Samples `/metrics` for the versions the gates ask about.
pub struct TrafficMonitor {
    client: Client,
    interval: Duration,
    watches: Mutex<BTreeMap<ResourceVersion, Watch>>,
    /// When the last sample succeeded (monotonic clock).
    last_success: Mutex<Option<tokio::time::Instant>>,
    last_error: Mutex<Option<String>>,
}

impl TrafficMonitor {
    pub fn new(client: Client, interval: Duration) -> Arc<Self> {
        Arc::new(Self {
            client,
            interval,
            watches: Mutex::new(BTreeMap::new()),
            last_success: Mutex::new(None),
            last_error: Mutex::new(None),
        })
    }

    /// What is known of requests to a version; starts watching it on first call. `None`
    /// until a sample was taken, or while samples fail (then no quiet window can be
    /// claimed).
    pub fn observation(&self, key: &ResourceVersion) -> Option<TrafficObservation> {
        let stale = lock(&self.last_success).is_none_or(|t| t.elapsed() > self.interval * 3);
        let mut watches = lock(&self.watches);
        let watch = watches.entry(key.clone()).or_insert(Watch {
            observation: None,
            last_total: 0.0,
            deprecated_seen: false,
        });
        if stale { None } else { watch.observation }
    }

    /// Why samples fail, if they do.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// Samples every `interval` until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        loop {
            if !lock(&self.watches).is_empty() {
                self.sample_once().await;
            }
            tokio::time::sleep(self.interval).await;
        }
    }

    /// Takes one sample now and updates every watch.
    pub async fn sample_once(&self) {
        let request = match http::Request::get("/metrics").body(Vec::new()) {
            Ok(request) => request,
            Err(_) => return,
        };
        let text = match self.client.request_text(request).await {
            Ok(text) => text,
            Err(error) => {
                warn!(error = %error, "cannot read the apiserver's /metrics for the traffic gate");
                *lock(&self.last_error) = Some(format!("cannot read the apiserver's /metrics: {error}"));
                return;
            }
        };
        let now = Timestamp::now();
        self.record(&parse_metrics(&text), now);
    }

    /// Applies a sample taken at `now` (public for tests).
    pub fn record(&self, sample: &MetricsSample, now: Timestamp) {
        *lock(&self.last_success) = Some(tokio::time::Instant::now());
        *lock(&self.last_error) = None;
        for (key, watch) in lock(&self.watches).iter_mut() {
            let total = sample.requests.get(key).copied().unwrap_or(0.0);
            let deprecated = sample.deprecated_requested.contains(key);
            match &mut watch.observation {
                None => {
                    watch.observation = Some(TrafficObservation {
                        watching_since: now,
                        last_request: None,
                    });
                }
                Some(observation) => {
                    // Moved (or reset: an apiserver restarted, or another instance
                    // answered): a request may have happened since the last sample.
                    if total != watch.last_total || (deprecated && !watch.deprecated_seen) {
                        observation.last_request = Some(now);
                    }
                }
            }
            watch.last_total = total;
            watch.deprecated_seen = deprecated;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// apiserver-samples/17.
    const SAMPLE: &str = include_str!("../../tests/fixtures/metrics-excerpt.txt");

    fn key(version: &str) -> ResourceVersion {
        ("example.com".into(), version.into(), "widgets".into())
    }

    #[test]
    fn parses_request_counts_by_group_version_resource() {
        let sample = parse_metrics(SAMPLE);
        assert_eq!(sample.requests.get(&key("v1")), Some(&15.0));
        assert_eq!(sample.requests.get(&key("v1alpha1")), Some(&11.0));
        assert!(sample.deprecated_requested.contains(&key("v1alpha1")));
        assert!(!sample.deprecated_requested.contains(&key("v1")));
    }

    #[test]
    fn parses_escapes_and_ignores_other_lines() {
        let text = "# HELP x\nother_total{a=\"b\"} 3\n\
                    apiserver_request_total{group=\"g\\\"q\",resource=\"r\",version=\"v\"} 2.5e0\n\
                    apiserver_request_total{group=\"g\\\"q\",resource=\"r\",version=\"v\",code=\"200\"} 1 1700000000000\n\
                    apiserver_request_total{broken\n";
        let sample = parse_metrics(text);
        assert_eq!(sample.requests.len(), 1);
        assert_eq!(
            sample.requests.get(&("g\"q".into(), "v".into(), "r".into())),
            Some(&3.5)
        );
    }
}
