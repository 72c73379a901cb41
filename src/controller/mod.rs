//! The controller: applies VersionPolicies to live CRDs on schedule, with status, events,
//! metrics, leader election and graceful shutdown. Its rooms:
//!
//! - [`process`]: `run` and `replica`, leadership term after term, the Lease election, the
//!   HTTP endpoints;
//! - [`watch`]: the watches and what each change triggers;
//! - the state every reconcile shares: [`Context`] (built with [`Context::builder`]), the
//!   CRDs this process saw ([`crds_seen`]: how fresh a kept copy is, whether a patch was
//!   watched), the ordering of patches before bookkeeping ([`patches_first`]);
//! - the reconcile in named steps (`reconcile`), and what it writes: [`status`] (from an
//!   `Observation`), [`conditions`], [`events`], [`metrics`], the guarded CRD [`patch`];
//! - what the gates read in the background: [`traffic`], [`writers_gate`];
//! - the background jobs under one runner ([`jobs`]): migrations, managedFields cleanups,
//!   the built-in engine and conversion preflights, each run keyed by CRD and kind and
//!   working towards a typed goal.
//!
//! The conversion webhook's operations live next to the webhook (`crate::webhook::ca`,
//! `crate::webhook::run`).

pub mod conditions;
mod context;
pub(crate) mod crds_seen;
mod error;
pub mod events;
pub mod jobs;
pub mod metrics;
pub(crate) mod patch;
pub(crate) mod patches_first;
mod process;
mod reconcile;
mod request;
pub mod status;
pub mod traffic;
mod watch;
pub mod writers_gate;

pub use context::{Context, ContextBuilder};
pub use crds_seen::CrdsSeen;
pub use error::Error;
pub use process::{Probes, RunError, RunSettings, SHUTDOWN_GRACE, http, leader, replica, run};
pub use reconcile::decide;
pub use reconcile::gates;
pub use reconcile::govern::competing_owner;
pub use reconcile::release::RELEASE_FINALIZER;
pub use reconcile::wake::requeue_after;
pub use reconcile::{error_policy, reconcile};
pub use request::status_code;
pub use watch::controller;
