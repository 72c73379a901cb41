//! The process around the controller: [`run`] (signals, the metrics and probes server, the
//! conversion webhook, then leadership), [`replica`] (the same without the process, for
//! simulations), the term loop of leadership (`lead`, over the Lease election of
//! [`leader`]), and the HTTP endpoints (`/healthz`, `/readyz`, `/metrics`: [`http`]).

pub mod http;
mod lead;
pub mod leader;
mod run;
mod settings;

pub use run::{Probes, replica, run};
pub use settings::{RunError, RunSettings, SHUTDOWN_GRACE};
