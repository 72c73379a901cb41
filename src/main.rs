use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use crd_lifecycle::cli::{Cli, Command, LogFormat, RunArgs};
use crd_lifecycle::controller::leader::LeaseSettings;
use crd_lifecycle::controller::{self, RunSettings};
use crd_lifecycle::{api, kubeclient, plan};

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
        Command::Run(args) => {
            init_logging(cli.log_format);
            block_on(run(args))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => {
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}

fn block_on<F: Future<Output = Result<(), (u8, String)>>>(future: F) -> Result<(), (u8, String)> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| (1, format!("cannot start the async runtime: {e}")))?
        .block_on(future)
}

async fn run(args: RunArgs) -> Result<(), (u8, String)> {
    let client = kubeclient::client(&args.cluster)
        .await
        .map_err(|e| (1, e.to_string()))?;
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let lease = args.leader_election.then(|| {
        LeaseSettings::new(
            args.lease_namespace.clone(),
            args.lease_name.clone(),
            identity.clone(),
        )
    });
    let settings = RunSettings {
        metrics_address: args.metrics_addr,
        lease,
        resync: args.resync,
        identity,
    };
    controller::run(client, settings)
        .await
        .map_err(|e| (1, e.to_string()))
}

fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "crd-lifecycle".to_owned());
    format!("{host}-{}", std::process::id())
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
