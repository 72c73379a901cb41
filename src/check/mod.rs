//! `crd-lifecycle check`: what applying incoming CRDs (a chart's, an operator release's)
//! would do to a live cluster, before the upgrade runs, and `check --fix`: exactly what
//! unblocks them.
//!
//! - `incoming`: reading the incoming CRDs (files, directories, stdin; non-CRDs skipped);
//! - `findings`: the findings and the fix plan, from plain data (pure);
//! - `collect`: what is read of the cluster for them (I/O, only what a finding needs);
//! - `fix`: the fix's steps, through the migrator and a guarded patch (I/O);
//! - `render`: table, JSON and Markdown.

mod collect;
mod findings;
mod fix;
mod incoming;
mod render;

use std::io::IsTerminal;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use kube::Client;

pub use collect::ReadSettings;
pub use findings::{
    Cause, CrdCheck, Finding, FixPlan, FixStep, Governing, Judgement, ManagerWrite, ObjectProblem, Observed,
    Severity, Validated, check, human_duration, keep_writers, lost_without_conversion, plan_fix,
};
pub use fix::{FixObserver, StepResult, rollback_patch};
pub use incoming::{Error as IncomingError, Incoming, IncomingCrd, read as read_incoming};
pub use render::{CheckFormat, ClusterReport, CrdFix, Report, Summary, render};

/// How a check reads and judges.
#[derive(Clone, Debug)]
pub struct CheckSettings {
    pub read: ReadSettings,
    /// CRDs read at once.
    pub concurrency: usize,
    /// A manager that wrote through a version within this long is an active writer.
    pub writers_window: Duration,
    /// Field managers the release replaces: their recent writes do not break the check.
    pub replaced_managers: Vec<String>,
}

/// With `--fix`: how the migrator runs, and where progress goes.
pub struct FixSettings<'a> {
    pub migrate: crate::migrate::Settings,
    pub observer: &'a dyn FixObserver,
}

/// Checks the incoming CRDs against one cluster (and, with `fix`, fixes what blocks them,
/// then checks again).
pub async fn run(
    client: &Client,
    context: Option<String>,
    incoming: &Incoming,
    settings: &CheckSettings,
    fix: Option<&FixSettings<'_>>,
) -> ClusterReport {
    let mut report = ClusterReport {
        context,
        server_version: None,
        error: None,
        crds: Vec::new(),
        fixes: Vec::new(),
    };
    let server = match client.apiserver_version().await {
        Ok(info) => {
            let number = |s: &str| s.trim_end_matches('+').parse::<u32>().ok();
            report.server_version = Some(format!("{}.{}", info.major, info.minor));
            number(&info.major).zip(number(&info.minor))
        }
        Err(error) => {
            report.error = Some(format!("cluster unreachable: {error}"));
            return report;
        }
    };
    let mut checked = check_all(client, incoming, settings, server).await;
    if let Some(fix) = fix {
        let mut fixed_any = false;
        for (check, observed) in &checked {
            let plan = plan_fix(check, observed);
            if plan.steps.is_empty() && plan.refusals.is_empty() {
                continue;
            }
            let results = if plan.refusals.is_empty() {
                fixed_any = true;
                fix::apply(
                    client,
                    &check.name,
                    &plan.steps,
                    observed.governed_by.as_ref(),
                    &fix.migrate,
                    fix.observer,
                )
                .await
            } else {
                for refusal in &plan.refusals {
                    fix.observer.note(&check.name, &format!("not fixed: {refusal}"));
                }
                Vec::new()
            };
            report.fixes.push(CrdFix {
                crd: check.name.clone(),
                plan,
                results,
            });
        }
        if fixed_any {
            let before = std::mem::take(&mut checked);
            checked = check_all(client, incoming, settings, server).await;
            // The cleanup rewrote the writers' managedFields entries, not the writers.
            for (after, _) in &mut checked {
                if let Some((before, _)) = before.iter().find(|(b, _)| b.name == after.name) {
                    keep_writers(before, after);
                }
            }
        }
    }
    report.crds = checked.into_iter().map(|(check, _)| check).collect();
    report
}

/// Every incoming CRD checked, a few at once, in the order given; a progress bar on a
/// terminal.
async fn check_all(
    client: &Client,
    incoming: &Incoming,
    settings: &CheckSettings,
    server: Option<(u32, u32)>,
) -> Vec<(CrdCheck, Observed)> {
    let policies = collect::policies(client).await;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(incoming.crds.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} checking [{bar:30}] {pos}/{len} CRDs {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let judgement = Judgement {
        now: Timestamp::now(),
        writers_window: settings.writers_window,
        server,
        replaced_managers: settings.replaced_managers.clone(),
    };
    let checked: Vec<(CrdCheck, Observed)> = futures::stream::iter(&incoming.crds)
        .map(|one| {
            let (policies, bar, judgement) = (&policies, &bar, &judgement);
            async move {
                let observed = collect::observe(client, &one.crd, policies, &settings.read).await;
                let check = check(&one.crd, &one.origin, &observed, judgement);
                if let Some(bar) = bar {
                    bar.set_message(check.name.clone());
                    bar.inc(1);
                }
                (check, observed)
            }
        })
        .buffered(settings.concurrency.max(1))
        .collect()
        .await;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    checked
}
