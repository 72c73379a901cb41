//! How a run behaves: what it does to each object, its pace, retries and checkpoints.

use std::time::Duration;

use backon::ExponentialBuilder;

use super::{Resume, SettleCheck};

/// What to do with each object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Rewrite it into the storage version, then trim `status.storedVersions`.
    Rewrite,
    /// Only read it through the storage version (conversion preflight); write nothing.
    Preflight,
    /// Rewrite the `metadata.managedFields` entries that name stale versions so that they
    /// name the storage version (see `Settings::managed_fields`); no trim.
    CleanManagedFields,
}

/// Which managedFields entries a `Mode::CleanManagedFields` run rewrites.
#[derive(Clone, Debug, Default)]
pub struct ManagedFieldsCleanup {
    /// The versions whose entries are rewritten (a version about to be removed); `None`:
    /// every version the CRD no longer has (repairing objects after a removal).
    pub versions: Option<Vec<String>>,
    /// The policy's declarative conversion, to translate the entries' field paths.
    pub conversion: Option<crate::api::ConversionSpec>,
    /// Count the objects that need a rewrite; write nothing.
    pub dry_run: bool,
}

/// How requests that may succeed later are retried: 5xx, 429 (after its `Retry-After`),
/// timeouts and connection failures, with exponential backoff and jitter.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts per request, the first included.
    pub attempts: u32,
    /// Wait before the first retry; doubled every retry.
    pub base_delay: Duration,
    /// Longest wait between retries.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 6,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    pub(super) fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.base_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.attempts.saturating_sub(1) as usize)
            .with_jitter()
    }
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Objects per list request.
    pub page_size: u32,
    /// Requests per second (lists and discovery included); 0 for no limit.
    pub qps: u32,
    pub mode: Mode,
    pub retry: RetryPolicy,
    /// Longest wait for one request's answer; a request that takes longer is retried.
    pub request_timeout: Duration,
    /// How the storage switch (or, for a preflight, the version being served) is confirmed
    /// through discovery before the first request and before the trim.
    pub settle: SettleCheck,
    /// Resume an interrupted run from its checkpoint; ignored (a fresh run starts) when the
    /// CRD changed since.
    pub resume: Option<Resume>,
    /// How many failures the report lists.
    pub max_reported_failures: usize,
    /// How often the whole run may start over because the storage version changed.
    pub max_restarts: usize,
    /// How many times in a row the continue token may expire without a page listed in
    /// between before the run gives up.
    pub max_expired_in_a_row: usize,
    /// With `Mode::Preflight`: read through this version instead of the storage version
    /// (the version a `store` is about to switch to).
    pub through_version: Option<String>,
    /// With `Mode::Preflight`: the declarative conversion the CRD's webhook serves. Each
    /// object is then also read through the storage version, converted with it, and checked
    /// against the target version's schema, so that a field the apiserver would prune (or a
    /// value it would reject) fails the preflight naming the object and the path.
    pub preflight_conversion: Option<crate::api::ConversionSpec>,
    /// With `Mode::Preflight`: objects an earlier preflight through the same version,
    /// conversion and schemas read and found fit. They are listed, but one still at the
    /// resourceVersion it had then is not read again (counted as skipped): only objects
    /// created or changed since are checked.
    pub preflight_checked: Option<std::sync::Arc<super::CheckedObjects>>,
    /// With `Mode::Rewrite`: send rewrites to the `/status` subresource.
    pub through_status: bool,
    /// With `Mode::CleanManagedFields`: which entries.
    pub managed_fields: ManagedFieldsCleanup,
    /// With `Mode::Rewrite`: how long the trim waits for the watch of the CRD to deliver
    /// the state it trims at; past it, the CRD's generation decides whether the storage
    /// version may have changed in between (`StorageGuard`).
    pub history_wait: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            concurrency: 16,
            page_size: 500,
            qps: 0,
            mode: Mode::Rewrite,
            retry: RetryPolicy::default(),
            request_timeout: Duration::from_secs(60),
            settle: SettleCheck::default(),
            resume: None,
            max_reported_failures: 20,
            max_restarts: 3,
            max_expired_in_a_row: 10,
            through_version: None,
            preflight_conversion: None,
            preflight_checked: None,
            through_status: false,
            managed_fields: ManagedFieldsCleanup::default(),
            history_wait: Duration::from_secs(10),
        }
    }
}
