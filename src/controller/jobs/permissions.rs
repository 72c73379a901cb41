//! Before a background run starts, may this controller do what it needs on the CRD's
//! objects? Asked with SelfSubjectAccessReviews (`migrate::permissions`); a missing grant
//! blocks the policy (`MissingPermission`) with the ClusterRole to add, and no run starts.

use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::BackgroundJobs;
use crate::api::{RewriteSubresource, VersionPolicy};
use crate::migrate::{Mode, permissions};
use crate::sync::lock;

/// How long an allowed answer stands: a revoked grant is noticed within this (and by the
/// run itself, whose requests would then fail).
const PERMITTED_FOR: Duration = Duration::from_secs(300);

/// How soon a policy blocked because an outside change must happen first (the built-in
/// migrator's API enabled, another migrator finishing) is checked again.
pub(crate) const RECHECK_MISSING_AFTER: Duration = Duration::from_secs(60);

/// How soon, at most, a policy blocked by a missing permission is checked again: granting
/// one changes no object the controller watches, so it is asked again after 1 s, then 2, 4,
/// 8 and from then on every 10 s (a grant is noticed within about 10 s, and a policy that
/// stays blocked costs a few SelfSubjectAccessReviews a minute).
const RECHECK_GRANT_AT_MOST_AFTER: Duration = Duration::from_secs(10);

impl BackgroundJobs {
    /// When to ask again for a policy whose run is blocked by a missing permission (bounded
    /// backoff); `None`, and the backoff forgotten, when nothing is missing.
    pub(crate) fn recheck_grant_after(&self, policy: &str, missing: bool) -> Option<Duration> {
        let mut checks = lock(&self.missing_checks);
        if !missing {
            checks.remove(policy);
            return None;
        }
        let attempt = checks.entry(policy.to_owned()).or_insert(0);
        let delay = Duration::from_secs(1u64 << (*attempt).min(4)).min(RECHECK_GRANT_AT_MOST_AFTER);
        *attempt = attempt.saturating_add(1);
        Some(delay)
    }

    /// Forgets every cached "allowed" for the CRD's objects (a run found one revoked).
    pub(super) fn forget_permissions(&self, crd: &str) {
        let prefix = format!("{crd}/");
        lock(&self.permitted_at).retain(|key, _| !key.starts_with(&prefix));
    }

    /// `Ok` when this controller may run `mode` over the policy's CRD; otherwise the
    /// message naming each missing verb and the ClusterRole that grants it. A review that
    /// fails (not a denial) is logged and does not block: the run reports what it meets.
    pub(crate) async fn check_permissions(&self, policy: &VersionPolicy, mode: Mode) -> Result<(), String> {
        let crd = &policy.spec.crd_name;
        let through_status = policy.spec.migration.subresource == Some(RewriteSubresource::Status);
        let key = format!("{crd}/{mode:?}/{through_status}");
        if lock(&self.permitted_at)
            .get(&key)
            .is_some_and(|at| at.elapsed() < PERMITTED_FOR)
        {
            return Ok(());
        }
        let needed = permissions::required(crd, mode, through_status, false);
        match permissions::missing(&self.client, &needed).await {
            Ok(missing) if missing.is_empty() => {
                lock(&self.permitted_at).insert(key, Instant::now());
                Ok(())
            }
            Ok(missing) => {
                lock(&self.permitted_at).remove(&key);
                Err(permissions::missing_message(crd, &missing, through_status))
            }
            Err(error) => {
                warn!(crd, error = %error, "cannot check permissions; starting the run anyway");
                Ok(())
            }
        }
    }
}
