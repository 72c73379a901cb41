//! The Events reference, from their definition (`controller::events::EventReason`): every
//! reason the operator publishes an Event with, its type, the object it is about and what it
//! tells.

use crd_lifecycle::controller::events::EventReason;
use kube::runtime::events::EventType;

use super::markdown::{cell, wrap};

/// The page `reference/events.md`.
pub(super) fn render() -> String {
    let mut page = String::from("# Events reference\n\n");
    page.push_str(&super::generated_from("`src/controller/events.rs`"));
    page.push('\n');
    page.push_str(&wrap(
        "The controller publishes Kubernetes Events on the VersionPolicy (and, for the CA \
         bundle, on the CRD), reported as `crd-lifecycle` with the replica's identity; \
         cluster-scoped objects' Events live in the `default` namespace, and \
         `kubectl describe vp NAME` shows them. Besides the reasons below, a \
         Warning carries a Blocked condition's reason (see the \
         [conditions reference](conditions.md)) when something starts holding a policy back; \
         it is not repeated while the same message stands.",
    ));
    page.push_str("\n\n| reason | type | regarding | meaning |\n| --- | --- | --- | --- |\n");
    for reason in EventReason::ALL {
        let type_ = match reason.event_type() {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        page.push_str(&format!(
            "| `{}` | {type_} | {} | {} |\n",
            reason.as_str(),
            reason.regarding(),
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
        for reason in super::EventReason::ALL {
            assert!(page.contains(&format!("| `{}` |", reason.as_str())), "{reason:?}");
        }
    }
}
