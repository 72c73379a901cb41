//! Engine, plan and CLI tests: one test binary, so the suite links once.

mod cli;
mod example;
mod fixtures;
mod properties;
mod validation;
