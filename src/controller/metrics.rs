//! Prometheus metrics, served on `/metrics`.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::webhook::WebhookMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub crd: String,
    pub version: String,
    pub milestone: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub policy: String,
    pub state: String,
}

/// The states a policy is counted in (`crd_lifecycle_policy_state`), from its conditions.
pub const POLICY_STATES: [&str; 5] = ["Ready", "Reconciling", "Stalled", "Suspended", "NotReady"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BlockedLabels {
    pub policy: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CrdLabels {
    pub crd: String,
}

/// A running background job of a CRD: `migration` or `managed_fields_cleanup`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub crd: String,
    pub job: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MigrationResultLabels {
    pub crd: String,
    pub result: String,
}

/// Every metric the operator exports, prefixed `crd_lifecycle_`.
pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Counter,
    pub reconcile_failures: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Histogram,
    pub transitions_applied: Family<TransitionLabels, Counter>,
    pub next_transition: Family<PolicyLabels, Gauge<f64, AtomicU64>>,
    pub blocked: Family<BlockedLabels, Gauge>,
    pub policy_state: Family<StateLabels, Gauge>,
    pub leader: Gauge,
    pub leadership_losses: Counter,
    pub objects_migrated: Family<CrdLabels, Counter>,
    pub objects_failed: Family<CrdLabels, Counter>,
    pub objects_remaining: Family<JobLabels, Gauge>,
    pub job_objects_done: Family<JobLabels, Gauge>,
    pub job_objects_expected: Family<JobLabels, Gauge>,
    pub job_objects_per_second: Family<JobLabels, Gauge<f64, AtomicU64>>,
    pub migrations: Family<MigrationResultLabels, Counter>,
    pub migration_duration: Histogram,
    pub objects_repaired: Family<CrdLabels, Counter>,
    pub managed_fields_cleanups: Family<MigrationResultLabels, Counter>,
    /// The conversion webhook's reviews and certificate.
    pub webhook: Arc<WebhookMetrics>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("crd_lifecycle");
        let mut metrics = Self::unregistered();
        metrics.register_reconciles(&mut registry);
        metrics.register_jobs(&mut registry);
        metrics.webhook = Arc::new(WebhookMetrics::registered(&mut registry));
        metrics.registry = registry;
        metrics
    }
}

impl Metrics {
    /// Every metric, new and in no registry yet.
    fn unregistered() -> Self {
        Self {
            registry: Registry::default(),
            reconciles: Counter::default(),
            reconcile_failures: Family::<ErrorLabels, Counter>::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            transitions_applied: Family::<TransitionLabels, Counter>::default(),
            next_transition: Family::<PolicyLabels, Gauge<f64, AtomicU64>>::default(),
            blocked: Family::<BlockedLabels, Gauge>::default(),
            policy_state: Family::<StateLabels, Gauge>::default(),
            leader: Gauge::default(),
            leadership_losses: Counter::default(),
            objects_migrated: Family::<CrdLabels, Counter>::default(),
            objects_failed: Family::<CrdLabels, Counter>::default(),
            objects_remaining: Family::<JobLabels, Gauge>::default(),
            job_objects_done: Family::<JobLabels, Gauge>::default(),
            job_objects_expected: Family::<JobLabels, Gauge>::default(),
            job_objects_per_second: Family::<JobLabels, Gauge<f64, AtomicU64>>::default(),
            migrations: Family::<MigrationResultLabels, Counter>::default(),
            migration_duration: Histogram::new(exponential_buckets(0.1, 2.0, 16)),
            objects_repaired: Family::<CrdLabels, Counter>::default(),
            managed_fields_cleanups: Family::<MigrationResultLabels, Counter>::default(),
            webhook: Arc::new(WebhookMetrics::default()),
        }
    }

    /// The reconciles', the policies' and leadership's metrics, into `registry`.
    fn register_reconciles(&self, registry: &mut Registry) {
        registry.register(
            "reconciles",
            "Reconciles of VersionPolicies",
            self.reconciles.clone(),
        );
        registry.register(
            "reconcile_failures",
            format!(
                "Reconciles that failed and will be retried, by error: the apiserver request that failed ({}), or {}",
                super::request::Request::ALL.map(super::request::Request::label).join(", "),
                super::request::OTHER_FAILURE_LABELS.join(", ")
            ),
            self.reconcile_failures.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time a reconcile takes",
            Unit::Seconds,
            self.reconcile_duration.clone(),
        );
        registry.register(
            "transitions_applied",
            "Transitions applied to CRDs, by crd, version and milestone",
            self.transitions_applied.clone(),
        );
        registry.register(
            "next_transition_timestamp_seconds",
            "When each policy's next transition is scheduled (Unix time)",
            self.next_transition.clone(),
        );
        registry.register(
            "blocked",
            "1 while a policy is blocked, by policy and reason (the Blocked condition's reasons)",
            self.blocked.clone(),
        );
        registry.register(
            "policy_state",
            "1 for each policy's state: Ready, Reconciling, Stalled, Suspended or NotReady",
            self.policy_state.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            self.leader.clone(),
        );
        registry.register(
            "leadership_losses",
            "Times this replica lost the leader lease (it stops every writer and stands by to lead again)",
            self.leadership_losses.clone(),
        );
    }

    /// The background jobs' metrics, into `registry`.
    fn register_jobs(&self, registry: &mut Registry) {
        registry.register(
            "migration_objects_migrated",
            "Objects rewritten into the storage version (or found already rewritten)",
            self.objects_migrated.clone(),
        );
        registry.register(
            "migration_objects_failed",
            "Objects that could not be rewritten",
            self.objects_failed.clone(),
        );
        registry.register(
            "migration_objects_remaining",
            "Objects not yet done by the running job (job: migration or managed_fields_cleanup; when the apiserver reports a total), by crd and job",
            self.objects_remaining.clone(),
        );
        registry.register(
            "migration_objects_done",
            "Objects the running job has finished (rewritten, skipped or failed), by crd and job",
            self.job_objects_done.clone(),
        );
        registry.register(
            "migration_objects_expected",
            "Objects the running job expects in all (a full count when it starts), by crd and job",
            self.job_objects_expected.clone(),
        );
        registry.register(
            "migration_objects_per_second",
            "Objects the running job finishes per second over the last 10 s, by crd and job",
            self.job_objects_per_second.clone(),
        );
        registry.register(
            "migrations",
            "Finished migrations, by crd and result: succeeded, failed, error or missing_permission",
            self.migrations.clone(),
        );
        registry.register_with_unit(
            "migration_duration",
            "Time a migration run takes",
            Unit::Seconds,
            self.migration_duration.clone(),
        );
        registry.register(
            "managed_fields_objects_repaired",
            "Objects whose managedFields entries naming a version about to be removed were rewritten",
            self.objects_repaired.clone(),
        );
        registry.register(
            "managed_fields_cleanups",
            "Finished managedFields cleanups, by crd and result: succeeded, failed, error or missing_permission",
            self.managed_fields_cleanups.clone(),
        );
    }
}

impl Metrics {
    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }

    pub fn observe_reconcile(&self, elapsed: Duration) {
        self.reconciles.inc();
        self.reconcile_duration.observe(elapsed.as_secs_f64());
    }

    pub fn record_failure(&self, label: &str) {
        self.reconcile_failures
            .get_or_create(&ErrorLabels {
                error: label.to_owned(),
            })
            .inc();
    }

    pub fn record_transition(&self, crd: &str, version: &str, milestone: &str) {
        self.transitions_applied
            .get_or_create(&TransitionLabels {
                crd: crd.to_owned(),
                version: version.to_owned(),
                milestone: milestone.to_owned(),
            })
            .inc();
    }

    /// Records the policy's next transition (or forgets it when there is none).
    pub fn set_next_transition(&self, policy: &str, at: Option<jiff::Timestamp>) {
        let labels = PolicyLabels {
            policy: policy.to_owned(),
        };
        match at {
            Some(at) => {
                self.next_transition
                    .get_or_create(&labels)
                    .set(at.as_millisecond() as f64 / 1000.0);
            }
            None => {
                self.next_transition.remove(&labels);
            }
        }
    }

    /// Sets a policy's state (one of `POLICY_STATES`), or forgets the policy (`None`).
    pub fn set_state(&self, policy: &str, state: Option<&str>) {
        for known in POLICY_STATES {
            let labels = StateLabels {
                policy: policy.to_owned(),
                state: known.to_owned(),
            };
            if state == Some(known) {
                self.policy_state.get_or_create(&labels).set(1);
            } else {
                self.policy_state.remove(&labels);
            }
        }
    }

    /// Forgets what this replica reported of each policy (its state, blocks, next
    /// transition): a replica that stopped leading no longer knows, and a standby that went
    /// on exporting its last view would keep alerts firing (or double them) after the leader
    /// resolved them.
    pub fn forget_policies(&self) {
        self.next_transition.clear();
        self.blocked.clear();
        self.policy_state.clear();
    }

    /// Forgets the progress gauges of a job that ended.
    pub fn forget_job(&self, labels: &JobLabels) {
        self.objects_remaining.remove(labels);
        self.job_objects_done.remove(labels);
        self.job_objects_expected.remove(labels);
        self.job_objects_per_second.remove(labels);
    }

    /// Sets the `blocked` gauge of a policy to exactly the given reasons.
    pub fn set_blocked(&self, policy: &str, reasons: &[&str]) {
        for reason in super::conditions::ConditionReason::ALL.map(super::conditions::ConditionReason::as_str)
        {
            let labels = BlockedLabels {
                policy: policy.to_owned(),
                reason: reason.to_owned(),
            };
            if reasons.contains(&reason) {
                self.blocked.get_or_create(&labels).set(1);
            } else {
                self.blocked.remove(&labels);
            }
        }
    }
}
