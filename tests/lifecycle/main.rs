//! Engine, plan and CLI tests: one test binary, so the suite links once.

#[path = "../support/flags.rs"]
mod flags;

mod cel_parity;
mod cli;
mod conversion;
mod crd_formats;
mod example;
mod fixtures;
mod gates;
mod kubectl_plugin;
mod properties;
mod schema_coverage;
mod schema_validation;
mod validation;
