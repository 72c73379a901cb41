//! The storage-version migrator: rewrites every object of a CRD through the apiserver (and
//! so through its conversion webhook) into the storage version, then trims the CRD's
//! `status.storedVersions` to that version.
//!
//! A rewrite's memory is bounded by the page size and the concurrency, whatever the number
//! of objects: objects are listed metadata-only, a page at a time, and processed by a
//! bounded pool of requests while the next page is fetched. Progress is checkpointed per
//! page (the continue token after the last page whose objects are all done), so a run can
//! resume. A conversion preflight is the exception: it remembers 16 bytes per object it
//! found fit (`CheckedObjects`, about 50 MB for a million objects with the map's overhead),
//! so that its check shortly before the store reads only what changed since.
//!
//! A rewrite watches its CRD from start to trim (`StorageGuard`): `status.storedVersions` is
//! trimmed only if every state of the CRD since the run started (since the interrupted run
//! started, for a resumed one) had the run's storage version.
//!
//! - `migration`: `migrate`, one migration from reading the CRD to the trim; `run`: its
//!   listing passes and bounded pool of requests; `trim`: its last step;
//! - `requests`: every request of a run, sent raw; `crd_reads`: the CRD read as a `Target`
//!   (`target`); `lister`: the metadata-only pager other callers use;
//! - `discovery`: the settle check; `storage_guard`: the CRD watched from start to trim;
//! - `progress`, `report`: checkpoints, counts and the outcome; `settings`, `error`;
//! - `managed_fields`: a cleanup's rewrite of managedFields entries; `checked`: what a
//!   preflight remembers; `digest`, `count`: the objects as they are now;
//! - `permissions`: what a run needs and whether the caller has it;
//! - `another_migrator`, `builtin`: Kubernetes' built-in migrator, and what it gets of ours.

mod another_migrator;
mod apiserver_clock;
pub mod builtin;
mod checked;
pub mod command;
mod count;
mod crd_reads;
mod digest;
mod discovery;
mod error;
mod lister;
pub mod managed_fields;
mod migration;
pub mod permissions;
mod progress;
mod report;
mod requests;
mod run;
mod settings;
mod storage_guard;
mod target;
mod trim;

pub use another_migrator::{settled_target, trim_after};
pub use checked::CheckedObjects;
pub use count::count_objects;
pub use digest::{ObjectsDigest, objects_digest};
pub use discovery::{SettleCheck, storage_version_hash};
pub use error::Error;
pub use lister::{Collection, Folded, ListSettings, Listed, Lister};
pub use migration::migrate;
pub use progress::{Checkpoint, Counts, ObjectResult, Observer, PageTracker, Quiet, Rate, Resume};
pub use report::{Failure, Outcome, Report};
pub use requests::{Answer, ObjectKey, Page};
pub use settings::{ManagedFieldsCleanup, Mode, RetryPolicy, Settings};
pub use storage_guard::{GuardStart, StorageGuard, Verdict};
pub use target::{Target, conversion_fingerprint};
