//! `crd-lifecycle check`: the pure findings on plain data, the command against the fake
//! apiserver (every rule of which cites a recorded response), and the binary's exit codes
//! and outputs.

#[path = "../support/apiserver/mod.rs"]
mod apiserver;
#[path = "../support/over_http.rs"]
mod over_http;

mod command;
mod findings;
