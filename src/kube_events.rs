//! Kubernetes Events, built and published one way by every part of the operator: the
//! policies' Events (`controller::events`), and the CRDs' when the apiserver refuses the
//! webhook's CA bundle (`webhook::ca`).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::warn;

/// An event with its note cut to what the apiserver keeps.
pub fn event(type_: EventType, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        note: Some(truncate(note)),
        action: action.to_owned(),
        secondary: None,
    }
}

/// Publishes an event; a failure is logged, never fatal.
pub async fn send(recorder: &Recorder, reference: &ObjectReference, event: Event) {
    if let Err(error) = recorder.publish(&event, reference).await {
        warn!(reason = event.reason, error = %error, "cannot publish event");
    }
}

/// Event notes are limited to 1 kB.
pub fn truncate(mut note: String) -> String {
    const LIMIT: usize = 1000;
    if note.len() > LIMIT {
        let mut end = LIMIT - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_truncated_on_a_char_boundary() {
        let note = truncate("é".repeat(800));
        assert!(note.len() <= 1000 && note.ends_with("..."));
    }
}
