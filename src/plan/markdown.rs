//! `plan -o markdown`: the lifecycle page for a CRD's users. It depends only on the policy
//! and the CRD (not on `--at` or the clock), so the same input renders the same page, which
//! can be checked in and diffed.

use jiff::Timestamp;

use super::Plan;
use crate::api::{ConversionStep, MilestoneKind, VersionPolicy};

/// The page.
pub fn render(policy: &VersionPolicy, plan: &Plan) -> String {
    let crd = &plan.crd.name;
    let mut out = format!("# Lifecycle of `{crd}`\n\n");
    out.push_str(&wrap(&format!(
        "The versions of `{crd}` follow the schedule of the VersionPolicy `{}`. Times are UTC.",
        policy.metadata.name.as_deref().unwrap_or("(unnamed)")
    )));

    out.push_str("\n## Versions\n\n");
    out.push_str("| Version | Introduced | Stored | Deprecated | Unserved | Removed |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for version in &plan.schedule.versions {
        let cells: Vec<String> = MilestoneKind::ALL
            .iter()
            .map(|kind| version.at(*kind).map_or_else(|| "—".to_owned(), date))
            .collect();
        out.push_str(&format!("| `{}` | {} |\n", version.name, cells.join(" | ")));
    }
    let warnings: Vec<String> = plan
        .schedule
        .versions
        .iter()
        .filter_map(|v| {
            v.warning
                .as_ref()
                .map(|w| format!("- `{}`: {}", v.name, inline_code(w)))
        })
        .collect();
    if !warnings.is_empty() {
        out.push_str("\nClients of a deprecated version get this warning:\n\n");
        out.push_str(&warnings.iter().map(|w| wrap(w)).collect::<String>());
    }

    out.push_str("\n## Gates\n\n");
    let gates = gates(policy, plan);
    if gates.is_empty() {
        out.push_str("No milestone waits for anything but its time.\n");
    } else {
        out.push_str(&gates.iter().map(|g| wrap(g)).collect::<String>());
    }

    out.push_str("\n## Field changes\n");
    let changes = policy
        .spec
        .conversion
        .as_ref()
        .map(|c| c.changes.as_slice())
        .unwrap_or_default();
    if changes.is_empty() {
        out.push('\n');
        out.push_str(&wrap(
            "No declarative conversion: objects read through any version keep their fields.",
        ));
    }
    for step in changes {
        out.push_str(&format!("\n### `{}` → `{}`\n\n", step.from, step.to));
        let lines = field_changes(step);
        if lines.is_empty() {
            out.push_str("No field changes.\n");
        } else {
            out.push_str(&lines.iter().map(|l| wrap(l)).collect::<String>());
        }
    }
    out
}

/// Longest line of prose (the Markdown lint's default).
const WIDTH: usize = 80;

/// A paragraph or a list item (`- ...`, continued two spaces in) wrapped at `WIDTH`
/// between words, ending in a newline. A word longer than a line keeps its own line.
fn wrap(text: &str) -> String {
    let indent = if text.starts_with("- ") { "  " } else { "" };
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !line.is_empty() && line.len() + 1 + word.len() > WIDTH {
            out.push_str(line.trim_end());
            out.push('\n');
            line = indent.to_owned();
        }
        if !line.is_empty() && line != indent {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// A milestone's instant: the date alone at midnight, else date and time.
fn date(at: Timestamp) -> String {
    let time = at.to_zoned(jiff::tz::TimeZone::UTC);
    if time.hour() == 0 && time.minute() == 0 && time.second() == 0 {
        time.strftime("%Y-%m-%d").to_string()
    } else if time.second() == 0 {
        time.strftime("%Y-%m-%d %H:%M").to_string()
    } else {
        time.strftime("%Y-%m-%d %H:%M:%S").to_string()
    }
}

/// Text as inline code, with a fence that the text itself does not contain.
fn inline_code(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if text.starts_with('`') || text.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{text}{pad}{fence}")
}

/// What holds milestones besides time, one list item each.
fn gates(policy: &VersionPolicy, plan: &Plan) -> Vec<String> {
    let mut gates = Vec::new();
    let name = policy.metadata.name.as_deref().unwrap_or("NAME");
    for version in &plan.schedule.versions {
        for kind in MilestoneKind::ALL {
            if version.at(kind).is_some() && version.needs_approval(kind) {
                gates.push(format!(
                    "- `{}` {kind} waits for an approval: `kubectl annotate vp {name} crdlifecycle.io/approve={}.{kind}`.",
                    version.name, version.name
                ));
            }
        }
        if let Some(quiet) = version.no_traffic_for
            && version.at(MilestoneKind::Unserve).is_some()
        {
            gates.push(format!(
                "- `{}` unserve waits until no client has called it for {quiet:#}.",
                version.name
            ));
        }
        if let Some(quiet) = version.no_writers_for
            && version.at(MilestoneKind::Unserve).is_some()
        {
            gates.push(format!(
                "- `{}` unserve waits until no field manager has written through it for {quiet:#} (managedFields).",
                version.name
            ));
        }
    }
    let migration = &policy.spec.migration;
    if migration.enabled {
        if migration.preflight {
            gates.push(
                "- Each store waits until every stored object converts to the new storage version \
                 (conversion preflight)."
                    .to_owned(),
            );
        }
        gates.push(
            "- Each removal waits until every object is migrated into the storage version and no \
             object's managedFields names the version."
                .to_owned(),
        );
    } else {
        gates.push(
            "- Each removal waits until `status.storedVersions` no longer lists the version \
             (migrations are off: run `crd-lifecycle migrate`)."
                .to_owned(),
        );
    }
    if policy.spec.enforce.is_some() {
        gates.push("- The schedule follows the Kubernetes API deprecation policy.".to_owned());
    }
    gates
}

/// The changes of one step, in words.
fn field_changes(step: &ConversionStep) -> Vec<String> {
    let mut lines = Vec::new();
    for renamed in &step.renamed {
        lines.push(format!("- renamed `{}` → `{}`", renamed.from, renamed.to));
    }
    for added in &step.added {
        let default = match &added.default {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        lines.push(format!(
            "- added `{}` (default {})",
            added.path,
            inline_code(&default)
        ));
    }
    for removed in &step.removed {
        lines.push(format!("- removed `{removed}`"));
    }
    for changed in &step.changed {
        lines.push(format!(
            "- changed `{}`: upgrade {}, downgrade {}",
            changed.path,
            inline_code(&changed.upgrade),
            inline_code(&changed.downgrade)
        ));
    }
    for loss in &step.accept_loss {
        lines.push(format!("- dropped on purpose `{}`: {}", loss.path, loss.reason));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_spans_survive_backticks() {
        assert_eq!(inline_code("int(self)"), "`int(self)`");
        assert_eq!(inline_code("a`b"), "``a`b``");
        assert_eq!(inline_code("`x`"), "`` `x` ``");
    }

    #[test]
    fn prose_wraps_at_eighty_columns() {
        let item = format!("- {}", "word ".repeat(40));
        let wrapped = wrap(&item);
        assert!(wrapped.lines().all(|l| l.len() <= WIDTH), "{wrapped}");
        assert!(
            wrapped.lines().skip(1).all(|l| l.starts_with("  word")),
            "{wrapped}"
        );
        assert_eq!(wrap("short"), "short\n");
    }

    #[test]
    fn dates_are_short_at_midnight() {
        assert_eq!(date("2026-03-01T00:00:00Z".parse().expect("t")), "2026-03-01");
        assert_eq!(
            date("2026-03-01T12:30:00Z".parse().expect("t")),
            "2026-03-01 12:30"
        );
        assert_eq!(
            date("2026-03-01T12:30:05Z".parse().expect("t")),
            "2026-03-01 12:30:05"
        );
    }
}
