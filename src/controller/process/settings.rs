//! What a replica is started with (`RunSettings`), why it stops (`RunError`), and how long
//! it may take to (`SHUTDOWN_GRACE`): shared by `run` and the term loop of `lead`.

use std::net::SocketAddr;
use std::time::Duration;

use super::leader::LeaseSettings;
use crate::supervise;
use crate::webhook::WebhookSettings;

/// Settings of `crd-lifecycle run`.
#[derive(Clone, Debug)]
pub struct RunSettings {
    pub metrics_address: SocketAddr,
    /// `None` disables leader election (a single replica, or a local run).
    pub lease: Option<LeaseSettings>,
    pub resync: Duration,
    /// Name reported as the events' reporting instance.
    pub identity: String,
    /// Storage-version migrations that may run at once.
    pub parallel_migrations: usize,
    /// How often the apiserver's `/metrics` is sampled for traffic gates.
    pub traffic_sample_interval: Duration,
    /// How long a StorageVersionMigration may stay Pending before its run fails.
    pub svm_pending_deadline: Duration,
    /// The conversion webhook to serve, if any.
    pub webhook: Option<WebhookSettings>,
}

/// Why `run` stopped other than by a shutdown signal.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot reach the apiserver: {0}")]
    Unreachable(#[source] kube::Error),
    #[error("cannot serve metrics and probes on the --metrics-addr address: {0}")]
    Http(#[source] std::io::Error),
    #[error("cannot start the conversion webhook: {0}")]
    Webhook(String),
    #[error(transparent)]
    TaskFailed(#[from] supervise::TaskFailed),
}

/// How long after SIGTERM the controller may take to stop (the kubelet's default grace
/// period is 30 s; a rollout should not wait for it).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);
