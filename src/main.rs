//! `crd-lifecycle`: parses the command line and dispatches to `commands/`.

mod cli;
mod commands;
mod docgen;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

fn main() -> ExitCode {
    let cli = match cli::Cli::from_arg_matches_mut(&mut command().get_matches()) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    match commands::dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

/// The command line, named as it was invoked: `kubectl crd-lifecycle` when run as the
/// kubectl plugin `kubectl-crd_lifecycle`, so that help and errors show what to type.
fn command() -> clap::Command {
    let command = cli::Cli::command();
    let invoked = std::env::args_os().next().and_then(|arg| {
        std::path::Path::new(&arg)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
    });
    match invoked.as_deref() {
        Some(name) if name.starts_with("kubectl-") => command.bin_name("kubectl crd-lifecycle"),
        _ => command,
    }
}
