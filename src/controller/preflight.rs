//! Conversion preflights: before a `store`, every object is read through the version it
//! switches to (nothing written); the result goes to `status.preflight` and gates the store.

use std::sync::Arc;
use tokio::time::Instant;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::warn;

use super::migrations::{Migrations, PREFLIGHT_FIELD_MANAGER, PREFLIGHT_STANDS_FOR, Running};
use super::status::apply_status;
use crate::api::{MigrationPhase, PreflightStatus, VersionPolicy};
use crate::migrate::{self, Mode};
use crate::sync::lock;

impl Migrations {
    /// Starts a conversion preflight of the policy's CRD through `version` (every object
    /// read through it, nothing written) unless one runs or failed recently; the result
    /// goes to `status.preflight`.
    pub fn ensure_preflight(self: &Arc<Self>, policy: &VersionPolicy, version: &str) {
        let key = format!("preflight/{}/{version}", policy.spec.crd_name);
        let mut running = lock(&self.running);
        if running.get(&key).is_some_and(|r| !r.handle.is_finished()) {
            return;
        }
        if lock(&self.failed_at)
            .get(&key)
            .is_some_and(|at| at.elapsed() < self.retry_after_failure)
        {
            return;
        }
        if lock(&self.passed_at)
            .get(&key)
            .is_some_and(|at| at.elapsed() < PREFLIGHT_STANDS_FOR)
        {
            return;
        }
        let this = self.clone();
        let policy = policy.clone();
        let target = version.to_owned();
        let handle = tokio::spawn(async move { this.run_preflight(policy, target).await });
        running.insert(
            key,
            Running {
                goal: version.to_owned(),
                handle,
            },
        );
    }

    async fn run_preflight(self: Arc<Self>, policy: VersionPolicy, version: String) {
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let crd = policy.spec.crd_name.clone();
        let name = policy.metadata.name.clone().unwrap_or_default();
        let reference = policy.object_ref(&());
        let key = format!("preflight/{crd}/{version}");
        let mut status = PreflightStatus {
            version: version.clone(),
            phase: MigrationPhase::Running,
            finished_at: None,
            read: 0,
            failed: 0,
            failures: Vec::new(),
            message: Some(format!("reading every object of {crd} through {version}")),
        };
        self.write_preflight(&name, &status).await;
        let note = format!("conversion preflight: reading every object of {crd} through {version}");
        self.event(&reference, EventType::Normal, "PreflightStarted", note)
            .await;
        let settings = migrate::Settings {
            concurrency: usize::try_from(policy.spec.migration.concurrency).unwrap_or(16),
            page_size: policy.spec.migration.page_size,
            qps: policy.spec.migration.qps,
            mode: Mode::Preflight,
            through_version: Some(version.clone()),
            // The CRD converts through the operator's webhook: check what it produces
            // against the schema too (the apiserver prunes silently on read).
            preflight_conversion: policy.spec.conversion.clone().filter(|c| c.webhook.enabled),
            retry: self.retry.clone(),
            settle: self.settle.clone(),
            ..migrate::Settings::default()
        };
        let result = migrate::migrate(&self.client, &crd, &settings, &migrate::Quiet).await;
        status.finished_at = Some(Time(Timestamp::now()));
        let passed = match result {
            Ok(report) => {
                status.read = report.counts.rewritten;
                status.failed = report.counts.failed;
                status.failures = report.failures.iter().map(ToString::to_string).collect();
                status.message = Some(report.summary());
                report.succeeded()
            }
            Err(error) => {
                status.message = Some(error.to_string());
                false
            }
        };
        let (phase, type_, reason) = if passed {
            (MigrationPhase::Succeeded, EventType::Normal, "PreflightSucceeded")
        } else {
            (
                MigrationPhase::Failed,
                EventType::Warning,
                "ConversionPreflightFailed",
            )
        };
        status.phase = phase;
        self.write_preflight(&name, &status).await;
        let note = status.message.clone().unwrap_or_default();
        self.event(&reference, type_, reason, note).await;
        if passed {
            lock(&self.failed_at).remove(&key);
            lock(&self.passed_at).insert(key, Instant::now());
        } else {
            lock(&self.failed_at).insert(key, Instant::now());
        }
    }

    async fn write_preflight(&self, name: &str, status: &PreflightStatus) {
        let status = json!({"preflight": status});
        if let Err(error) = apply_status(&self.client, name, PREFLIGHT_FIELD_MANAGER, status).await {
            warn!(policy = name, error = %error, "cannot write the preflight status");
        }
    }
}
