use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use crd_lifecycle::cli::{Cli, Command};
use crd_lifecycle::{api, plan};

/// Exit code for invalid input (bad arguments, files or policies), as clap uses.
const EXIT_INVALID_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan(args) => {
            plan::run(&args, &mut std::io::stdout().lock()).map_err(|e| (EXIT_INVALID_INPUT, e.to_string()))
        }
        Command::Crd => api::versionpolicy_crd_yaml()
            .map_err(|e| (1, e.to_string()))
            .and_then(|yaml| {
                std::io::stdout()
                    .write_all(yaml.as_bytes())
                    .map_err(|e| (1, e.to_string()))
            }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => {
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}
