//! The lifecycle engine: pure functions from (policy, CRD, stored versions, completed
//! migrations, instant) to the CRD's versions as they must be, the timeline, the next
//! transition and what is blocked. No I/O and no kube client here.

pub mod apiserver_rules;
mod crd;
pub mod deprecation_policy;
mod duration;
mod engine;
mod error;
mod gates;
mod render;
mod schedule;
mod validate;

pub use crd::{CrdState, CrdVersion};
pub use duration::parse_duration;
pub use engine::{
    BlockReason, Blocked, CompletedMigration, DesiredVersion, Evaluation, MigrationNeed, evaluate,
    phase_of_flags,
};
pub use error::{Error, FieldError, FieldErrors};
pub use gates::{
    APPROVE_ANNOTATION, GateInputs, PreflightPass, PreflightResult, TrafficObservation, WritersRead,
    parse_approvals,
};
pub use render::{as_manifest, render_crd};
pub use schedule::{Schedule, ScheduledVersion, Transition};

use jiff::Timestamp;

/// What `status.storedVersions` would be at `at` if every migration completed the moment
/// its storage switch happened (the offline assumption of `crd-lifecycle plan`): the
/// storage version alone once a `store` is due, the CRD's own list before that.
pub fn assume_migrations_complete(schedule: &Schedule, crd: &CrdState, at: Timestamp) -> Vec<String> {
    match schedule.storage_at(at) {
        Some(storage) => vec![storage.name.clone()],
        None => crd.effective_stored_versions(),
    }
}
