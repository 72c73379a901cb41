//! Events on VersionPolicies, for reconciles, migrations, cleanups and releases (built and
//! published through `kube_events`).

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};

use super::status::Observation;
use crate::api::{MilestoneKind, VersionPolicy};
use crate::kube_events::{send, truncate};
use crate::lifecycle::Transition;

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
    for transition in observation.applied {
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
