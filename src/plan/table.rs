//! `plan -o table`: the timeline and the state of each version, for people.

use jiff::SignedDuration;

use super::Plan;
use crate::api::{MilestoneKind, VersionPolicy};
use crate::lifecycle::Transition;

/// The readable timeline of a plan.
pub fn render(policy: &VersionPolicy, plan: &Plan) -> String {
    let evaluation = &plan.evaluation;
    let at = evaluation.at;
    let name = policy.metadata.name.as_deref().unwrap_or("(unnamed)");
    let mut out = format!(
        "VersionPolicy {name} for CRD {}, evaluated at {at}\n",
        plan.crd.name
    );
    let stored = plan.crd.stored_versions.join(", ");
    if plan.stored_versions_given {
        out.push_str(&format!("status.storedVersions (given): {stored}\n"));
    } else {
        out.push_str(&format!(
            "status.storedVersions (assuming each migration completes at its storage switch, and each \
             managedFields cleanup before its removal): {stored}\n"
        ));
    }

    out.push_str("\nTIMELINE\n");
    let next = evaluation.next_transition();
    let mut rows = vec![row(["INSTANT", "VERSION", "MILESTONE", "STATE", "DETAIL"])];
    for transition in &evaluation.timeline {
        let held = evaluation
            .blocked
            .iter()
            .any(|b| b.version == transition.version && b.milestone == Some(transition.milestone));
        let state = if held {
            "held".to_owned()
        } else if transition.at <= at {
            "done".to_owned()
        } else if Some(transition) == next {
            format!("next, in {}", human_duration(transition.at.duration_since(at)))
        } else {
            "upcoming".to_owned()
        };
        rows.push(vec![
            transition.at.to_string(),
            transition.version.clone(),
            transition.milestone.to_string(),
            state,
            detail(policy, transition),
        ]);
    }
    if evaluation.timeline.is_empty() {
        out.push_str("  (no milestones)\n");
    } else {
        out.push_str(&columns(&rows));
    }

    out.push_str(&format!("\nVERSIONS AT {at}\n"));
    let mut rows = vec![row([
        "VERSION",
        "PHASE",
        "SERVED",
        "STORAGE",
        "DEPRECATED",
        "WARNING",
    ])];
    for version in &evaluation.versions {
        let name = if version.governed {
            version.name.clone()
        } else {
            format!("{} (not governed)", version.name)
        };
        rows.push(vec![
            name,
            version.phase.to_string(),
            yes_no(version.present && version.served),
            yes_no(version.present && version.storage),
            yes_no(version.present && version.deprecated),
            version
                .deprecation_warning
                .clone()
                .filter(|_| version.present)
                .unwrap_or_default(),
        ]);
    }
    out.push_str(&columns(&rows));

    if let Some(need) = &evaluation.migration {
        out.push_str(&format!(
            "\nMIGRATION\n  objects stored in {} must be rewritten into {} before those versions can be removed\n",
            need.stale_versions.join(", "),
            need.storage_version
        ));
    }
    let losses: Vec<String> = policy
        .spec
        .conversion
        .iter()
        .flat_map(|conversion| &conversion.changes)
        .flat_map(|step| {
            step.accept_loss.iter().map(move |loss| {
                format!(
                    "  {} -> {} drops {} on purpose: {}\n",
                    step.from, step.to, loss.path, loss.reason
                )
            })
        })
        .collect();
    if !losses.is_empty() {
        out.push_str("\nACCEPTED LOSSES (the apiserver prunes these fields)\n");
        out.push_str(&losses.concat());
    }
    if !evaluation.blocked.is_empty() {
        out.push_str("\nBLOCKED\n");
        for blocked in &evaluation.blocked {
            let milestone = blocked.milestone.map(|m| format!(" {m}")).unwrap_or_default();
            out.push_str(&format!(
                "  {}{milestone} ({}): {}\n",
                blocked.version,
                blocked.reason.as_str(),
                blocked.message
            ));
        }
    }
    out
}

/// What the policy says about a milestone beyond its instant: how `after` was counted,
/// and the deprecation warning.
fn detail(policy: &VersionPolicy, transition: &Transition) -> String {
    let Some(entry) = policy.spec.versions.iter().find(|v| v.name == transition.version) else {
        return String::new();
    };
    let mut parts = Vec::new();
    if let Some((_, Some(after))) = entry.timing(transition.milestone) {
        let previous = MilestoneKind::ALL
            .into_iter()
            .take_while(|k| *k != transition.milestone)
            .filter(|k| entry.timing(*k).is_some())
            .last();
        if let Some(previous) = previous {
            parts.push(format!("{after} after {previous}"));
        }
    }
    if transition.milestone == MilestoneKind::Deprecate
        && let Some(warning) = entry.deprecate.as_ref().and_then(|d| d.warning.as_deref())
    {
        parts.push(format!("warning: {warning:?}"));
    }
    // Gates: offline they are assumed to pass at the milestone's instant.
    if entry.needs_approval(transition.milestone) {
        parts.push(format!(
            "gate: approval (crdlifecycle.io/approve={}.{})",
            transition.version, transition.milestone
        ));
    }
    if transition.milestone == MilestoneKind::Unserve
        && let Some(window) = entry
            .unserve
            .as_ref()
            .and_then(|u| u.require_no_traffic_for.as_deref())
    {
        parts.push(format!("gate: no requests for {window}"));
    }
    if transition.milestone == MilestoneKind::Unserve
        && let Some(window) = entry
            .unserve
            .as_ref()
            .and_then(|u| u.require_no_writers_for.as_deref())
    {
        parts.push(format!("gate: no writes for {window}"));
    }
    let migration = &policy.spec.migration;
    if transition.milestone == MilestoneKind::Store && migration.enabled && migration.preflight {
        parts.push(match migration.preflight_lead.as_deref() {
            Some(lead) => format!("gate: conversion preflight (starts {lead} before)"),
            None => "gate: conversion preflight".to_owned(),
        });
    }
    // Who rewrites the objects afterwards.
    if transition.milestone == MilestoneKind::Store {
        parts.push(match (migration.enabled, migration.engine) {
            (false, _) => "no migration (spec.migration.enabled: false)".to_owned(),
            (true, crate::api::MigrationEngine::Internal) => "migration: Internal".to_owned(),
            (true, crate::api::MigrationEngine::StorageVersionMigration) => {
                "migration: StorageVersionMigration (built-in)".to_owned()
            }
        });
    }
    // Every removal waits until no object's managedFields names the version.
    if transition.milestone == MilestoneKind::Remove {
        parts.push("after: managedFields cleanup".to_owned());
    }
    parts.join("; ")
}

fn yes_no(flag: bool) -> String {
    if flag { "yes" } else { "no" }.to_owned()
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| (*c).to_owned()).collect()
}

/// Left-aligned columns separated by two spaces, indented by two; the last column is not
/// padded.
fn columns(rows: &[Vec<String>]) -> String {
    let count = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..count)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for cells in rows {
        let mut line = String::from("  ");
        for (i, cell) in cells.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < cells.len() {
                line.push_str(&" ".repeat(widths[i] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `76d 4h`, `3h 20m`, `45s`: the two largest units.
fn human_duration(duration: SignedDuration) -> String {
    let total = duration.as_secs().max(0);
    let units = [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")];
    let mut parts = Vec::new();
    let mut rest = total;
    for (size, unit) in units {
        if rest >= size && parts.len() < 2 {
            parts.push(format!("{}{unit}", rest / size));
            rest %= size;
        } else if !parts.is_empty() {
            break;
        }
    }
    if parts.is_empty() {
        "0s".to_owned()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations() {
        assert_eq!(
            human_duration(SignedDuration::from_secs(76 * 86_400 + 4 * 3600 + 5)),
            "76d 4h"
        );
        assert_eq!(
            human_duration(SignedDuration::from_secs(3 * 3600 + 20 * 60)),
            "3h 20m"
        );
        assert_eq!(human_duration(SignedDuration::from_secs(86_400 + 30)), "1d");
        assert_eq!(human_duration(SignedDuration::from_secs(45)), "45s");
        assert_eq!(human_duration(SignedDuration::ZERO), "0s");
    }

    #[test]
    fn columns_align() {
        let rows = vec![row(["A", "BB", "C"]), row(["long", "x", ""])];
        assert_eq!(columns(&rows), "  A     BB  C\n  long  x\n");
    }
}
