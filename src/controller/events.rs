//! Events on VersionPolicies: one way to build and publish them, for reconciles,
//! migrations, cleanups and releases.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::warn;

use super::status::Observation;
use crate::api::{MilestoneKind, VersionPolicy};
use crate::lifecycle::Transition;

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

/// Events: one Normal event per applied transition, a Warning per blocked reason and for
/// corrected drift. Failing to publish an event never fails the reconcile.
pub async fn publish_events(
    policy: &VersionPolicy,
    observation: &Observation<'_>,
    drift: &[Transition],
    recorder: &Recorder,
) {
    let reference = policy.object_ref(&());
    let crd = &policy.spec.crd_name;
    let mut events = Vec::new();
    for transition in &observation.applied {
        events.push(Event {
            type_: EventType::Normal,
            reason: transition_reason(transition.milestone).to_owned(),
            note: Some(transition_note(crd, transition)),
            // Part of the recorder's de-duplication key: one event per version and milestone.
            action: format!("{}/{}", transition.milestone, transition.version),
            secondary: None,
        });
    }
    if !drift.is_empty() {
        let reset: Vec<String> = drift
            .iter()
            .map(|t| format!("{} {}", t.version, t.milestone))
            .collect();
        events.push(Event {
            type_: EventType::Warning,
            reason: "DriftCorrected".to_owned(),
            note: Some(truncate(format!(
                "{crd} had been changed back by someone else; restored: {}",
                reset.join(", ")
            ))),
            action: "CorrectDrift".to_owned(),
            secondary: None,
        });
    }
    if observation.conversion_configured {
        events.push(Event {
            type_: EventType::Normal,
            reason: "ConversionWebhookConfigured".to_owned(),
            note: Some(format!(
                "{crd} now converts between versions through this operator's webhook (spec.conversion)"
            )),
            action: "ConfigureConversion".to_owned(),
            secondary: None,
        });
    }
    if observation.conversion_restored {
        events.push(Event {
            type_: EventType::Normal,
            reason: "ConversionRestored".to_owned(),
            note: Some(format!(
                "{crd} has its spec.conversion from before this operator's webhook back (spec.conversion.webhook is off)"
            )),
            action: "RestoreConversion".to_owned(),
            secondary: None,
        });
    }
    if let Some(patch) = &observation.dry_run_patch {
        events.push(Event {
            type_: EventType::Normal,
            reason: "DryRun".to_owned(),
            note: Some(truncate(format!("dry run: would patch {crd} with {patch}"))),
            action: "DryRun".to_owned(),
            secondary: None,
        });
    }
    // A Warning when something starts holding the policy back (or holds it for another
    // reason), not again on every reconcile while nothing changed: the previous status'
    // Blocked condition already lists every message.
    let previous = policy
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Blocked" && c.status == "True")
        })
        .map(|c| c.message.as_str())
        .unwrap_or_default();
    for (reason, message) in &observation.blocked {
        if previous.contains(message.as_str()) {
            continue;
        }
        events.push(Event {
            type_: EventType::Warning,
            reason: reason.as_str().to_owned(),
            note: Some(truncate(message.clone())),
            action: "Reconcile".to_owned(),
            secondary: None,
        });
    }
    for event in events {
        send(recorder, &reference, event).await;
    }
}

fn transition_reason(milestone: MilestoneKind) -> &'static str {
    match milestone {
        MilestoneKind::Introduce => "VersionIntroduced",
        MilestoneKind::Store => "StorageVersionChanged",
        MilestoneKind::Deprecate => "VersionDeprecated",
        MilestoneKind::Unserve => "VersionUnserved",
        MilestoneKind::Remove => "VersionRemoved",
    }
}

fn transition_note(crd: &str, transition: &Transition) -> String {
    let version = &transition.version;
    let what = match transition.milestone {
        MilestoneKind::Introduce => format!("{version} of {crd} is now served"),
        MilestoneKind::Store => format!("{version} is now the storage version of {crd}"),
        MilestoneKind::Deprecate => format!("{version} of {crd} is now deprecated"),
        MilestoneKind::Unserve => format!("{version} of {crd} is no longer served"),
        MilestoneKind::Remove => format!("{version} was removed from {crd}"),
    };
    format!(
        "{what} ({} milestone scheduled at {})",
        transition.milestone, transition.at
    )
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
