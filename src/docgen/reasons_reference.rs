//! The conditions reference, from their definitions (`controller::conditions`): each
//! condition type, and every reason a condition is written with, where it appears and what
//! it means.

use crd_lifecycle::controller::conditions::{ConditionReason, ConditionType, StatusReason};

use super::markdown::{cell, wrap};

/// The page `reference/conditions.md`.
pub(super) fn render() -> String {
    let mut page = String::from("# Conditions reference\n\n");
    page.push_str(&super::generated_from("`src/controller/conditions.rs`"));
    page.push('\n');
    page.push_str(&wrap(
        "A VersionPolicy reports four conditions in `status.conditions` (kstatus-compatible: \
         `Ready`, `Reconciling`, `Stalled`, with `observedGeneration`); \
         [status and events](../concepts/controller.md#status) tells how they are decided.",
    ));
    page.push_str("\n\n| condition | meaning |\n| --- | --- |\n");
    for type_ in ConditionType::ALL {
        page.push_str(&format!(
            "| `{}` | {} |\n",
            type_.as_str(),
            cell(type_.description())
        ));
    }
    page.push_str(
        "\n## Why a policy is held back\n\nThese reasons hold a milestone or the whole policy: \
         `Blocked` is `True` with the first of them\n(and every message), `Ready` is `False` with \
         it, and `Stalled` or `Reconciling` is `True` with it as\nsaid below. Each also labels the \
         `crd_lifecycle_blocked` gauge and comes with a Warning event.\n\n\
         | reason | also | meaning |\n| --- | --- | --- |\n",
    );
    for reason in ConditionReason::ALL {
        let also = match (reason.needs_a_human(true), reason.needs_a_human(false)) {
            (true, _) => "Stalled (needs a human)",
            (false, true) => "Stalled with migrations off, else Reconciling",
            (false, false) if reason.resolves_by_itself(true) => "Reconciling (lifts by itself)",
            (false, false) => "neither Stalled nor Reconciling",
        };
        page.push_str(&format!(
            "| `{}` | {also} | {} |\n",
            reason.as_str(),
            cell(reason.description())
        ));
    }
    page.push_str(
        "\n## Other reasons\n\nWhat a healthy, working or failed policy reports.\n\n\
         | reason | condition | meaning |\n| --- | --- | --- |\n",
    );
    for reason in StatusReason::ALL {
        let carried: Vec<String> = reason
            .carried_by()
            .iter()
            .map(|(type_, status)| format!("`{}` {}", type_.as_str(), if *status { "True" } else { "False" }))
            .collect();
        page.push_str(&format!(
            "| `{}` | {} | {} |\n",
            reason.as_str(),
            carried.join(", "),
            cell(reason.description())
        ));
    }
    page
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_reason_is_on_the_page() {
        let page = super::render();
        for reason in super::ConditionReason::ALL {
            assert!(page.contains(&format!("| `{}` |", reason.as_str())), "{reason:?}");
        }
        for reason in super::StatusReason::ALL {
            assert!(page.contains(&format!("| `{}` |", reason.as_str())), "{reason:?}");
        }
    }
}
