//! The binary's subcommands: each turns its arguments into the library's settings and calls
//! the library.

mod adopt;
mod audit;
mod check;
mod convert;
mod docgen;
mod migrate;
mod plan;
mod rbac;
mod run;
mod test;
mod webhook;

use std::io::Write;

use crate::cli::{Cli, Command, LogFormat};

/// Why a command failed, and the exit code that says so.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Bad arguments, files or policies (exit code 2, as clap uses).
    #[error("{0}")]
    InvalidInput(String),
    /// Anything else (exit code 1).
    #[error("{0}")]
    Failed(String),
}

impl CommandError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CommandError::InvalidInput(_) => 2,
            CommandError::Failed(_) => 1,
        }
    }

    fn failed(error: impl std::fmt::Display) -> Self {
        CommandError::Failed(error.to_string())
    }

    fn invalid(error: impl std::fmt::Display) -> Self {
        CommandError::InvalidInput(error.to_string())
    }
}

/// Runs the command the arguments name.
pub fn dispatch(cli: Cli) -> Result<(), CommandError> {
    match cli.command {
        Command::Plan(args) => plan::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Test(args) => test::run(&args),
        Command::Audit(args) => block_on(audit::run(args)),
        Command::Adopt(args) => block_on(adopt::run(args)),
        Command::Crd => crd_lifecycle::api::versionpolicy_crd_yaml()
            .map_err(CommandError::failed)
            .and_then(|yaml| {
                std::io::stdout()
                    .write_all(yaml.as_bytes())
                    .map_err(CommandError::failed)
            }),
        Command::Run(args) => {
            init_logging(cli.log_format);
            block_on(run::run(args))
        }
        Command::Webhook(args) => {
            init_logging(cli.log_format);
            block_on(webhook::run(args))
        }
        Command::Migrate(args) => {
            init_logging(cli.log_format);
            block_on(migrate::migrate(args))
        }
        Command::Check(args) => block_on(check::run(args)),
        Command::Rbac(args) => rbac::run(&args),
        Command::Docgen(args) => docgen::run(&args),
        Command::RepairManagedFields(args) => {
            init_logging(cli.log_format);
            block_on(migrate::repair(args))
        }
    }
}

fn block_on<F: Future<Output = Result<(), CommandError>>>(future: F) -> Result<(), CommandError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CommandError::Failed(format!("cannot start the async runtime: {e}")))?
        .block_on(future)
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal, not in log files and collectors.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
