//! The process around the controller: [`run`] (signals, the metrics and probes server, the
//! conversion webhook, then leadership), [`replica`] (the same without the process, for
//! simulations), the term loop of leadership (`lead`, over the Lease election of
//! [`leader`]), and the HTTP endpoints (`/healthz`, `/readyz`, `/metrics`: [`http`]).

pub mod http;
mod lead;
pub mod leader;
mod run;

pub use run::{Probes, RunError, RunSettings, SHUTDOWN_GRACE, replica, run};
