//! Events on VersionPolicies, for reconciles, migrations, cleanups and releases (built and
//! published through `kube_events`).

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};

use super::status::Observation;
use crate::api::{MilestoneKind, VersionPolicy};
use crate::kube_events::send;
use crate::lifecycle::Transition;

/// Why the operator published an Event: its `reason`. Besides these, a Warning carries a
/// Blocked condition's reason (`ConditionReason`) when something starts holding a policy
/// back. The Events reference is generated from this list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventReason {
    /// A version was added to the CRD (its `introduce` milestone).
    VersionIntroduced,
    /// A version became the CRD's storage version (its `store` milestone).
    StorageVersionChanged,
    /// A version was marked deprecated, with its warning (its `deprecate` milestone).
    VersionDeprecated,
    /// A version stopped being served (its `unserve` milestone).
    VersionUnserved,
    /// A version was deleted from the CRD (its `remove` milestone).
    VersionRemoved,
    /// Someone changed back flags the policy had applied; the controller restored them.
    DriftCorrected,
    /// The CRD's `spec.conversion` now points at this operator's conversion webhook.
    ConversionWebhookConfigured,
    /// The CRD has its `spec.conversion` from before the webhook back (`spec.conversion.webhook.enabled` is off).
    ConversionRestored,
    /// With `spec.dryRun`: the patch the controller would have sent.
    DryRun,
    /// A deleted policy released its CRD, which keeps its versions (and its conversion through the webhook, recorded on it).
    CRDReleased,
    /// A deleted policy could not record its conversion on the CRD; it stays until it can, so that every version stays readable.
    CannotReleaseCRD,
    /// A migration of the CRD's objects into the storage version started (internal engine), or a StorageVersionMigration was created (built-in engine).
    MigrationStarted,
    /// A migration resumed from its checkpoint (after a restart or a new leader).
    MigrationResumed,
    /// Every object was rewritten into the storage version and `status.storedVersions` trimmed.
    MigrationSucceeded,
    /// A migration failed (objects that do not convert, the trim refused, a StorageVersionMigration that failed or went); retried after a wait.
    MigrationFailed,
    /// A rewrite of the managedFields entries that name a version about to be removed started.
    ManagedFieldsCleanupStarted,
    /// A managedFields cleanup resumed from its checkpoint.
    ManagedFieldsCleanupResumed,
    /// No object's managedFields names the cleaned versions any more.
    ManagedFieldsCleanupSucceeded,
    /// A managedFields cleanup failed (its message names the objects); retried after a wait.
    ManagedFieldsCleanupFailed,
    /// A run found a grant it needs missing (revoked since the controller checked); the message names the ClusterRole that grants it.
    MissingPermission,
    /// A conversion preflight started reading the objects through the version about to become the storage version.
    PreflightStarted,
    /// Every object converted through the version about to be stored.
    PreflightSucceeded,
    /// Objects did not convert through the version about to be stored: the store is held (`AwaitingPreflight`).
    ConversionPreflightFailed,
    /// Right before the store, the objects changed since the passed preflight converted too.
    PreflightVerified,
    /// Too many objects changed since the passed preflight: it is run again before the store.
    PreflightRepeated,
    /// The apiserver refused the webhook's CA bundle on a CRD pointed at it.
    CABundleRefused,
}

impl EventReason {
    /// Every reason, in the order of the reference.
    pub const ALL: [EventReason; 26] = [
        EventReason::VersionIntroduced,
        EventReason::StorageVersionChanged,
        EventReason::VersionDeprecated,
        EventReason::VersionUnserved,
        EventReason::VersionRemoved,
        EventReason::DriftCorrected,
        EventReason::ConversionWebhookConfigured,
        EventReason::ConversionRestored,
        EventReason::DryRun,
        EventReason::CRDReleased,
        EventReason::CannotReleaseCRD,
        EventReason::MigrationStarted,
        EventReason::MigrationResumed,
        EventReason::MigrationSucceeded,
        EventReason::MigrationFailed,
        EventReason::ManagedFieldsCleanupStarted,
        EventReason::ManagedFieldsCleanupResumed,
        EventReason::ManagedFieldsCleanupSucceeded,
        EventReason::ManagedFieldsCleanupFailed,
        EventReason::MissingPermission,
        EventReason::PreflightStarted,
        EventReason::PreflightSucceeded,
        EventReason::ConversionPreflightFailed,
        EventReason::PreflightVerified,
        EventReason::PreflightRepeated,
        EventReason::CABundleRefused,
    ];

    /// The Event's `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::VersionIntroduced => "VersionIntroduced",
            EventReason::StorageVersionChanged => "StorageVersionChanged",
            EventReason::VersionDeprecated => "VersionDeprecated",
            EventReason::VersionUnserved => "VersionUnserved",
            EventReason::VersionRemoved => "VersionRemoved",
            EventReason::DriftCorrected => "DriftCorrected",
            EventReason::ConversionWebhookConfigured => "ConversionWebhookConfigured",
            EventReason::ConversionRestored => "ConversionRestored",
            EventReason::DryRun => "DryRun",
            EventReason::CRDReleased => "CRDReleased",
            EventReason::CannotReleaseCRD => "CannotReleaseCRD",
            EventReason::MigrationStarted => "MigrationStarted",
            EventReason::MigrationResumed => "MigrationResumed",
            EventReason::MigrationSucceeded => "MigrationSucceeded",
            EventReason::MigrationFailed => "MigrationFailed",
            EventReason::ManagedFieldsCleanupStarted => "ManagedFieldsCleanupStarted",
            EventReason::ManagedFieldsCleanupResumed => "ManagedFieldsCleanupResumed",
            EventReason::ManagedFieldsCleanupSucceeded => "ManagedFieldsCleanupSucceeded",
            EventReason::ManagedFieldsCleanupFailed => "ManagedFieldsCleanupFailed",
            EventReason::MissingPermission => "MissingPermission",
            EventReason::PreflightStarted => "PreflightStarted",
            EventReason::PreflightSucceeded => "PreflightSucceeded",
            EventReason::ConversionPreflightFailed => "ConversionPreflightFailed",
            EventReason::PreflightVerified => "PreflightVerified",
            EventReason::PreflightRepeated => "PreflightRepeated",
            EventReason::CABundleRefused => crate::webhook::ca::CA_BUNDLE_REFUSED,
        }
    }

    /// Normal, or Warning for what someone should look at.
    pub fn event_type(self) -> EventType {
        match self {
            EventReason::DriftCorrected
            | EventReason::CannotReleaseCRD
            | EventReason::MigrationFailed
            | EventReason::ManagedFieldsCleanupFailed
            | EventReason::MissingPermission
            | EventReason::ConversionPreflightFailed
            | EventReason::CABundleRefused => EventType::Warning,
            _ => EventType::Normal,
        }
    }

    /// The kind of the object the Event is about.
    pub fn regarding(self) -> &'static str {
        match self {
            EventReason::CABundleRefused => "CustomResourceDefinition",
            _ => "VersionPolicy",
        }
    }

    /// What it tells, for the reference.
    pub fn description(self) -> &'static str {
        match self {
            EventReason::VersionIntroduced => "A version was added to the CRD (its `introduce` milestone).",
            EventReason::StorageVersionChanged => {
                "A version became the CRD's storage version (its `store` milestone)."
            }
            EventReason::VersionDeprecated => {
                "A version was marked deprecated, with its warning (its `deprecate` milestone)."
            }
            EventReason::VersionUnserved => "A version stopped being served (its `unserve` milestone).",
            EventReason::VersionRemoved => "A version was deleted from the CRD (its `remove` milestone).",
            EventReason::DriftCorrected => {
                "Someone changed back flags the policy had applied; the controller restored them."
            }
            EventReason::ConversionWebhookConfigured => {
                "The CRD's `spec.conversion` now points at this operator's conversion webhook."
            }
            EventReason::ConversionRestored => {
                "The CRD has its `spec.conversion` from before the webhook back (`spec.conversion.webhook.enabled` is off)."
            }
            EventReason::DryRun => "With `spec.dryRun`: the patch the controller would have sent.",
            EventReason::CRDReleased => {
                "A deleted policy released its CRD, which keeps its versions (and its conversion through the webhook, recorded on it)."
            }
            EventReason::CannotReleaseCRD => {
                "A deleted policy could not record its conversion on the CRD; it stays until it can, so that every version stays readable."
            }
            EventReason::MigrationStarted => {
                "A migration of the CRD's objects into the storage version started (internal engine), or a StorageVersionMigration was created (built-in engine)."
            }
            EventReason::MigrationResumed => {
                "A migration resumed from its checkpoint (after a restart or a new leader)."
            }
            EventReason::MigrationSucceeded => {
                "Every object was rewritten into the storage version and `status.storedVersions` trimmed."
            }
            EventReason::MigrationFailed => {
                "A migration failed (objects that do not convert, the trim refused, a StorageVersionMigration that failed or went); retried after a wait."
            }
            EventReason::ManagedFieldsCleanupStarted => {
                "A rewrite of the managedFields entries that name a version about to be removed started."
            }
            EventReason::ManagedFieldsCleanupResumed => {
                "A managedFields cleanup resumed from its checkpoint."
            }
            EventReason::ManagedFieldsCleanupSucceeded => {
                "No object's managedFields names the cleaned versions any more."
            }
            EventReason::ManagedFieldsCleanupFailed => {
                "A managedFields cleanup failed (its message names the objects); retried after a wait."
            }
            EventReason::MissingPermission => {
                "A run found a grant it needs missing (revoked since the controller checked); the message names the ClusterRole that grants it."
            }
            EventReason::PreflightStarted => {
                "A conversion preflight started reading the objects through the version about to become the storage version."
            }
            EventReason::PreflightSucceeded => {
                "Every object converted through the version about to be stored."
            }
            EventReason::ConversionPreflightFailed => {
                "Objects did not convert through the version about to be stored: the store is held (`AwaitingPreflight`)."
            }
            EventReason::PreflightVerified => {
                "Right before the store, the objects changed since the passed preflight converted too."
            }
            EventReason::PreflightRepeated => {
                "Too many objects changed since the passed preflight: it is run again before the store."
            }
            EventReason::CABundleRefused => {
                "The apiserver refused the webhook's CA bundle on a CRD pointed at it."
            }
        }
    }
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
    let mut events: Vec<Event> = observation
        .applied
        .iter()
        // The action is part of the recorder's de-duplication key: one event per version
        // and milestone.
        .map(|t| {
            let action = format!("{}/{}", t.milestone, t.version);
            event(transition_reason(t.milestone), transition_note(crd, t), action)
        })
        .collect();
    if !drift.is_empty() {
        let reset: Vec<String> = drift
            .iter()
            .map(|t| format!("{} {}", t.version, t.milestone))
            .collect();
        let note = format!(
            "{crd} had been changed back by someone else; restored: {}",
            reset.join(", ")
        );
        events.push(event(EventReason::DriftCorrected, note, "CorrectDrift"));
    }
    if observation.conversion_configured {
        let note =
            format!("{crd} now converts between versions through this operator's webhook (spec.conversion)");
        events.push(event(
            EventReason::ConversionWebhookConfigured,
            note,
            "ConfigureConversion",
        ));
    }
    if observation.conversion_restored {
        let note = format!(
            "{crd} has its spec.conversion from before this operator's webhook back (spec.conversion.webhook is off)"
        );
        events.push(event(EventReason::ConversionRestored, note, "RestoreConversion"));
    }
    if let Some(patch) = &observation.dry_run_patch {
        let note = format!("dry run: would patch {crd} with {patch}");
        events.push(event(EventReason::DryRun, note, "DryRun"));
    }
    events.extend(newly_blocked(policy, observation));
    for event in events {
        send(recorder, &reference, event).await;
    }
}

/// An Event of `reason` (its type from the reason), its note cut to what the apiserver
/// keeps.
pub fn event(reason: EventReason, note: String, action: impl AsRef<str>) -> Event {
    crate::kube_events::event(reason.event_type(), reason.as_str(), action.as_ref(), note)
}

/// A Warning when something starts holding the policy back (or holds it for another
/// reason), not again on every reconcile while nothing changed: the previous status'
/// Blocked condition already lists every message.
fn newly_blocked(policy: &VersionPolicy, observation: &Observation<'_>) -> Vec<Event> {
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
    observation
        .blocked
        .iter()
        .filter(|(_, message)| !previous.contains(message.as_str()))
        .map(|(reason, message)| {
            crate::kube_events::event(EventType::Warning, reason.as_str(), "Reconcile", message.clone())
        })
        .collect()
}

fn transition_reason(milestone: MilestoneKind) -> EventReason {
    match milestone {
        MilestoneKind::Introduce => EventReason::VersionIntroduced,
        MilestoneKind::Store => EventReason::StorageVersionChanged,
        MilestoneKind::Deprecate => EventReason::VersionDeprecated,
        MilestoneKind::Unserve => EventReason::VersionUnserved,
        MilestoneKind::Remove => EventReason::VersionRemoved,
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
