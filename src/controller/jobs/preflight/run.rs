//! Running a conversion preflight: every object of the CRD read through the version its
//! store switches to and checked (nothing written), its result written to that version's
//! entry of `status.preflights` under a field manager of its own.

use std::sync::Arc;

use crate::controller::events::EventReason;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use serde_json::json;
use tracing::warn;

use super::plan::{PreflightNeed, StorePreflight, fingerprint, recorded};
use crate::api::{MigrationPhase, PreflightStatus, VersionPolicy};
use crate::controller::jobs::goal::{Goal, JobKey};
use crate::controller::jobs::{BackgroundJobs, PREFLIGHT_FIELD_MANAGER};
use crate::controller::status::apply_status;
use crate::migrate::{self, Mode};

/// The field manager of the preflight through `version`: one per version, so that a
/// server-side apply of one entry of `status.preflights` neither drops nor overwrites
/// another's.
fn preflight_manager(version: &str) -> String {
    format!("{PREFLIGHT_FIELD_MANAGER}-{version}")
}

impl BackgroundJobs {
    /// Starts the conversion preflight of `plan` (every object of the policy's CRD read
    /// through its version, nothing written) unless it runs already; the task decides again
    /// on the policy as the apiserver has it (the cache may lag behind this controller's
    /// own writes: a result that passed or failed moments ago is not run again). The result
    /// goes to the version's entry of `status.preflights`.
    pub(super) fn ensure_preflight(self: &Arc<Self>, policy: &VersionPolicy, plan: StorePreflight) {
        let crd = policy.spec.crd_name.clone();
        let goal = Goal::Preflight {
            version: plan.version.clone(),
        };
        let this = self.clone();
        let policy = policy.clone();
        self.launch(&crd, goal, false, async move {
            let policy = this.fresh(policy).await;
            let status = policy.status.as_ref();
            if let PreflightNeed::Run(reason) = plan.need(recorded(status, &plan.version), this.now()) {
                this.run_preflight(policy, plan, reason.describe().map(str::to_owned))
                    .await;
            }
        });
    }

    /// How a preflight of the policy's CRD through `version` reads.
    pub(super) fn preflight_settings(&self, policy: &VersionPolicy, version: &str) -> migrate::Settings {
        migrate::Settings {
            concurrency: usize::try_from(policy.spec.migration.concurrency).unwrap_or(16),
            page_size: policy.spec.migration.page_size,
            qps: policy.spec.migration.qps,
            mode: Mode::Preflight,
            through_version: Some(version.to_owned()),
            // The CRD converts through the operator's webhook: check what it produces
            // against the schema too (the apiserver prunes silently on read).
            preflight_conversion: policy.spec.conversion.clone().filter(|c| c.webhook.enabled),
            retry: self.retry.clone(),
            settle: self.settle.clone(),
            ..migrate::Settings::default()
        }
    }

    /// Runs the conversion preflight of `plan`: every object of the policy's CRD read
    /// through its version, nothing written; `why`: why it runs (again), for the Event.
    pub(super) async fn run_preflight(
        self: Arc<Self>,
        mut policy: VersionPolicy,
        plan: StorePreflight,
        why: Option<String>,
    ) {
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let crd = policy.spec.crd_name.clone();
        let reference = policy.object_ref(&());
        let version = plan.version.clone();
        let key = JobKey::Preflight {
            crd: crd.clone(),
            version: version.clone(),
        };
        self.forget_checked_objects_of(&key);
        let ahead = Some(plan.store_at)
            .filter(|at| *at > self.now())
            .map(|at| format!(" ahead of the {version} store at {at}"))
            .unwrap_or_default();
        let mut status = self.opening_status(&plan, &crd, &ahead);
        self.write_preflight(&policy, &status).await;
        // The former single result is cleared with the first write.
        if let Some(recorded) = policy.status.as_mut() {
            recorded.preflight = None;
        }
        let because = why.map(|why| format!(" ({why})")).unwrap_or_default();
        let note =
            format!("conversion preflight: reading every object of {crd} through {version}{ahead}{because}");
        self.event(&reference, EventReason::PreflightStarted, note).await;
        let settings = self.preflight_settings(&policy, &version);
        let result = migrate::migrate(&self.client, &crd, &settings, &migrate::Quiet).await;
        status.finished_at = Some(Time(self.now()));
        let passed = self.record_preflight_result(&mut status, result, &key);
        let (phase, reason) = if passed {
            (MigrationPhase::Succeeded, EventReason::PreflightSucceeded)
        } else {
            (MigrationPhase::Failed, EventReason::ConversionPreflightFailed)
        };
        status.phase = phase;
        self.write_preflight(&policy, &status).await;
        let note = status.message.clone().unwrap_or_default();
        self.event(&reference, reason, note).await;
    }

    /// A preflight's status as it starts.
    fn opening_status(&self, plan: &StorePreflight, crd: &str, ahead: &str) -> PreflightStatus {
        let version = &plan.version;
        PreflightStatus {
            version: version.clone(),
            phase: MigrationPhase::Running,
            started_at: Some(Time(self.now())),
            finished_at: None,
            store_at: Some(Time(plan.store_at)),
            read: 0,
            objects_digest: None,
            fingerprint: Some(plan.fingerprint.clone()),
            conversion: None,
            verified_at: None,
            failed: 0,
            failures: Vec::new(),
            message: Some(format!("reading every object of {crd} through {version}{ahead}")),
        }
    }

    /// Records a preflight's result in `status` (and remembers the objects a passed one
    /// read); whether it passed.
    fn record_preflight_result(
        &self,
        status: &mut PreflightStatus,
        result: Result<migrate::Report, migrate::Error>,
        key: &JobKey,
    ) -> bool {
        match result {
            Ok(report) => {
                status.read = report.counts.rewritten;
                status.failed = report.counts.failed;
                status.failures = report.failures.iter().map(ToString::to_string).collect();
                status.message = Some(report.summary());
                status.objects_digest = report.objects_digest.clone();
                let fingerprint = report_fingerprint(&report);
                status.fingerprint = Some(fingerprint.clone());
                let passed = report.succeeded();
                if passed
                    && let (Some(digest), Some(checked)) = (report.objects_digest, report.checked_objects)
                {
                    self.remember_checked_objects(key, &digest, &fingerprint, checked);
                }
                passed
            }
            Err(error) => {
                status.message = Some(error.to_string());
                false
            }
        }
    }

    /// Writes the preflight's entry of `status.preflights` under its version's field
    /// manager; clears the single `status.preflight` an earlier release wrote (read until
    /// then, see [`recorded`]).
    pub(super) async fn write_preflight(&self, policy: &VersionPolicy, status: &PreflightStatus) {
        let name = policy.metadata.name.clone().unwrap_or_default();
        let manager = preflight_manager(&status.version);
        let entry = json!({"preflights": [status]});
        if let Err(error) = apply_status(&self.client, &name, &manager, entry).await {
            warn!(policy = name, error = %error, "cannot write the preflight status");
        }
        if policy.status.as_ref().is_some_and(|s| s.preflight.is_some()) {
            // Its field manager applies nothing: the field it owned goes.
            if let Err(error) = apply_status(&self.client, &name, PREFLIGHT_FIELD_MANAGER, json!({})).await {
                warn!(policy = name, error = %error, "cannot clear the former status.preflight");
            }
        }
    }
}

/// The [`fingerprint`] of what a preflight run checked against (the CRD as it read it).
pub(super) fn report_fingerprint(report: &migrate::Report) -> String {
    let target = &report.target;
    fingerprint(&target.conversion, &target.schemas, &target.version)
}
