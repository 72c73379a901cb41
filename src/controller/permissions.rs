//! Before a background run starts, may this controller do what it needs on the CRD's
//! objects? Asked with SelfSubjectAccessReviews (`migrate::permissions`); a missing grant
//! blocks the policy (`MissingPermission`) with the ClusterRole to add, and no run starts.

use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::migrations::Migrations;
use crate::api::{RewriteSubresource, VersionPolicy};
use crate::migrate::{Mode, permissions};
use crate::sync::lock;

/// How long an allowed answer stands: a revoked grant is noticed within this (and by the
/// run itself, whose requests would then fail).
const PERMITTED_FOR: Duration = Duration::from_secs(300);

/// How soon a policy blocked by a missing permission is checked again: granting one
/// changes no object the controller watches.
pub const RECHECK_MISSING_AFTER: Duration = Duration::from_secs(60);

impl Migrations {
    /// Forgets every cached "allowed" for the CRD's objects (a run found one revoked).
    pub fn forget_permissions(&self, crd: &str) {
        let prefix = format!("{crd}/");
        lock(&self.permitted_at).retain(|key, _| !key.starts_with(&prefix));
    }

    /// `Ok` when this controller may run `mode` over the policy's CRD; otherwise the
    /// message naming each missing verb and the ClusterRole that grants it. A review that
    /// fails (not a denial) is logged and does not block: the run reports what it meets.
    pub async fn check_permissions(&self, policy: &VersionPolicy, mode: Mode) -> Result<(), String> {
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
