//! The check of a passed preflight shortly before its store's instant: the objects listed
//! again, and those created or changed since the preflight read them read, converted and
//! checked the same way (`migrate::Settings::preflight_checked`); without the set it read (a
//! controller started since), their digest compared instead. Its time goes to the result's
//! `verifiedAt`.

use std::sync::Arc;

use crate::controller::events::EventReason;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use tracing::warn;

use super::plan::{PreflightNeed, StorePreflight, recorded};
use super::run::report_fingerprint;
use crate::api::{MigrationPhase, PreflightStatus, VersionPolicy};
use crate::controller::jobs::BackgroundJobs;
use crate::controller::jobs::goal::{Goal, JobKey};
use crate::migrate;

/// What a check before the store found.
enum Check {
    /// Every object fits: unchanged since they were checked, or read again and fit.
    Fit {
        /// Objects listed.
        listed: u64,
        /// Those read again (created or changed since).
        reread: u64,
        digest: String,
        /// The objects as listed, when they were listed by a run that can say.
        checked: Option<migrate::CheckedObjects>,
    },
    /// Objects read again do not fit.
    Failed(Box<migrate::Report>),
    /// It cannot be told without reading every object again: why.
    Repeat(String),
}

impl BackgroundJobs {
    /// Checks a passed preflight of `plan` before its store: lists the objects again and
    /// reads, converts and checks those created or changed since it read them (the set it
    /// read is remembered here); without that set (a controller started since), compares
    /// their digest, and reads every object again if it differs. Fit, the result's
    /// `verifiedAt` says when the check started; an object that does not fit fails it.
    pub(super) fn verify_preflight(self: &Arc<Self>, policy: &VersionPolicy, plan: StorePreflight) {
        let crd = policy.spec.crd_name.clone();
        let goal = Goal::Preflight {
            version: plan.version.clone(),
        };
        let this = self.clone();
        let policy = policy.clone();
        self.launch(&crd, goal, false, async move { this.verify(policy, plan).await });
    }

    /// The check `verify_preflight` runs, decided again on the policy as the apiserver has
    /// it: it may be due to run again instead, or not be needed any more.
    async fn verify(self: Arc<Self>, policy: VersionPolicy, plan: StorePreflight) {
        let policy = self.fresh(policy).await;
        let started = self.now();
        let Some(recorded) = recorded(policy.status.as_ref(), &plan.version).cloned() else {
            return;
        };
        match plan.need(Some(&recorded), started) {
            PreflightNeed::Verify => {}
            PreflightNeed::Run(reason) => {
                let why = reason.describe().map(str::to_owned);
                return self.run_preflight(policy, plan, why).await;
            }
            PreflightNeed::Nothing => return,
        }
        let key = JobKey::Preflight {
            crd: policy.spec.crd_name.clone(),
            version: plan.version.clone(),
        };
        let check = self.check(&policy, &plan, &key, &recorded).await;
        self.record_check(policy, plan, &key, recorded, started, check)
            .await;
    }

    /// Records what the check that started at `started` found: the result's `verifiedAt`
    /// (fit), its failure, or the preflight run again.
    async fn record_check(
        self: Arc<Self>,
        policy: VersionPolicy,
        plan: StorePreflight,
        key: &JobKey,
        recorded: PreflightStatus,
        started: Timestamp,
        check: Check,
    ) {
        let name = policy.metadata.name.clone().unwrap_or_default();
        let reference = policy.object_ref(&());
        let crd = &policy.spec.crd_name;
        let version = &plan.version;
        match check {
            Check::Fit {
                listed,
                reread,
                digest,
                checked,
            } => {
                let mut result = recorded.clone();
                result.verified_at = Some(Time(started));
                result.read = listed;
                result.objects_digest = Some(digest.clone());
                let note = format!(
                    "objects of {crd} checked again for the {version} store at {}: {reread} of {listed} created or changed since were read through {version} and fit",
                    plan.store_at
                );
                result.message = Some(note.clone());
                self.write_preflight(&policy, &result).await;
                if let Some(checked) = checked {
                    self.remember_checked_objects(key, &digest, &plan.fingerprint, checked);
                }
                self.event(&reference, EventReason::PreflightVerified, note).await;
            }
            Check::Failed(report) => {
                self.forget_checked_objects_of(key);
                let mut result = recorded.clone();
                result.phase = MigrationPhase::Failed;
                result.finished_at = Some(Time(self.now()));
                result.failed = report.counts.failed;
                result.failures = report.failures.iter().map(ToString::to_string).collect();
                let note = format!(
                    "objects created or changed since the preflight: {}",
                    report.summary()
                );
                result.message = Some(note.clone());
                warn!(policy = name, "{note}");
                self.write_preflight(&policy, &result).await;
                self.event(&reference, EventReason::ConversionPreflightFailed, note)
                    .await;
            }
            Check::Repeat(reason) => {
                let note = format!("conversion preflight of {version} runs again: {reason}");
                self.event(&reference, EventReason::PreflightRepeated, note).await;
                self.run_preflight(policy, plan, None).await;
            }
        }
    }

    /// Lists the objects again and checks those changed since `recorded` read them.
    async fn check(
        &self,
        policy: &VersionPolicy,
        plan: &StorePreflight,
        key: &JobKey,
        recorded: &PreflightStatus,
    ) -> Check {
        let crd = &policy.spec.crd_name;
        let Some(digest) = recorded.objects_digest.clone() else {
            return Check::Repeat("the result does not say which objects it read".to_owned());
        };
        let Some(checked) = self.checked_objects_of(key, &digest, &plan.fingerprint) else {
            // Without the set (a controller started since): unchanged or not at all.
            let settings = migrate::Settings {
                page_size: policy.spec.migration.page_size,
                retry: self.retry.clone(),
                ..migrate::Settings::default()
            };
            return match migrate::objects_digest(&self.client, crd, &settings).await {
                Ok(now) if now == digest => Check::Fit {
                    listed: recorded.read,
                    reread: 0,
                    digest,
                    checked: None,
                },
                Ok(_) => Check::Repeat(
                    "the objects changed since it passed, and this controller (started since) does not know which"
                        .to_owned(),
                ),
                Err(error) => Check::Repeat(format!(
                    "the objects could not be listed to check they did not change: {error}"
                )),
            };
        };
        let settings = migrate::Settings {
            preflight_checked: Some(checked),
            ..self.preflight_settings(policy, &plan.version)
        };
        match migrate::migrate(&self.client, crd, &settings, &migrate::Quiet).await {
            Ok(report) if !report.succeeded() => Check::Failed(Box::new(report)),
            Ok(report) => {
                let fingerprint = report_fingerprint(&report);
                match report.objects_digest.clone() {
                    Some(digest) if fingerprint == plan.fingerprint => Check::Fit {
                        listed: report.counts.listed,
                        reread: report.counts.rewritten,
                        digest,
                        checked: report.checked_objects,
                    },
                    Some(_) => Check::Repeat(
                        "the CRD's conversion, storage version or schemas changed meanwhile".to_owned(),
                    ),
                    None => Check::Repeat("the objects could not be listed in one pass".to_owned()),
                }
            }
            Err(error) => Check::Repeat(format!("the objects could not be checked again: {error}")),
        }
    }
}
