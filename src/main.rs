use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use crd_lifecycle::cli::{Cli, Command, LogFormat, MigrateArgs, RepairArgs, RunArgs};
use crd_lifecycle::controller::leader::LeaseSettings;
use crd_lifecycle::controller::{self, CertificateSource, RunSettings, WebhookSettings, WebhookTarget};
use crd_lifecycle::migrate::{self, Mode};
use crd_lifecycle::{api, convert, kubeclient, plan, webhook};

/// Exit code for invalid input (bad arguments, files or policies), as clap uses.
const EXIT_INVALID_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan(args) => {
            plan::run(&args, &mut std::io::stdout().lock()).map_err(|e| (EXIT_INVALID_INPUT, e.to_string()))
        }
        Command::Convert(args) => convert::run(&args, &mut std::io::stdout().lock())
            .map_err(|e| (EXIT_INVALID_INPUT, e.to_string())),
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
        Command::Webhook(args) => {
            init_logging(cli.log_format);
            block_on(async move { webhook::standalone::run(&args).await.map_err(|e| (1, e)) })
        }
        Command::Migrate(args) => {
            init_logging(cli.log_format);
            block_on(run_migrate(args))
        }
        Command::RepairManagedFields(args) => {
            init_logging(cli.log_format);
            block_on(run_repair(args))
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
        parallel_migrations: usize::try_from(args.parallel_migrations).unwrap_or(2),
        traffic_sample_interval: args.traffic_sample_interval,
        webhook: webhook_settings(&args)?,
    };
    controller::run(client, settings)
        .await
        .map_err(|e| (1, e.to_string()))
}

async fn run_migrate(args: MigrateArgs) -> Result<(), (u8, String)> {
    let client = kubeclient::client(&args.cluster)
        .await
        .map_err(|e| (1, e.to_string()))?;
    let settings = migrate::Settings {
        concurrency: usize::try_from(args.concurrency).unwrap_or(16),
        page_size: args.page_size,
        qps: args.qps,
        mode: if args.dry_run {
            Mode::Preflight
        } else {
            Mode::Rewrite
        },
        request_timeout: std::time::Duration::from_secs(args.request_timeout),
        through_status: args.subresource.is_some(),
        ..migrate::Settings::default()
    };
    run_with_progress(&client, &args.crd, &settings).await
}

async fn run_repair(args: RepairArgs) -> Result<(), (u8, String)> {
    let client = kubeclient::client(&args.cluster)
        .await
        .map_err(|e| (1, e.to_string()))?;
    let settings = migrate::Settings {
        concurrency: usize::try_from(args.concurrency).unwrap_or(16),
        page_size: args.page_size,
        qps: args.qps,
        mode: Mode::CleanManagedFields,
        managed_fields: migrate::ManagedFieldsCleanup {
            versions: None,
            conversion: None,
            dry_run: args.dry_run,
        },
        request_timeout: std::time::Duration::from_secs(args.request_timeout),
        ..migrate::Settings::default()
    };
    run_with_progress(&client, &args.crd, &settings).await
}

/// Runs the migrator with a progress display, prints the summary and the first failures,
/// and maps the outcome to the exit code (0 done, 1 failures, 2 a missing CRD).
async fn run_with_progress(
    client: &kube::Client,
    crd: &str,
    settings: &migrate::Settings,
) -> Result<(), (u8, String)> {
    let display = migrate::command::ProgressDisplay::for_stderr(crd);
    let result = migrate::migrate(client, crd, settings, &display).await;
    display.finish();
    match result {
        Ok(report) => {
            println!("{}", report.summary());
            if report.succeeded() {
                return Ok(());
            }
            for failure in &report.failures {
                println!("  {failure}");
            }
            if report.counts.failed > report.failures.len() as u64 {
                println!(
                    "  ... and {} more",
                    report.counts.failed - report.failures.len() as u64
                );
            }
            let what = match settings.mode {
                Mode::CleanManagedFields => "the repair",
                Mode::Rewrite | Mode::Preflight => "the migration",
            };
            Err((1, format!("{what} did not complete")))
        }
        Err(error @ migrate::Error::CrdNotFound(_)) => Err((EXIT_INVALID_INPUT, error.to_string())),
        Err(error) => Err((1, error.to_string())),
    }
}

/// The conversion webhook `run` serves, from its flags.
fn webhook_settings(args: &RunArgs) -> Result<Option<WebhookSettings>, (u8, String)> {
    let flags = &args.webhook;
    let Some(port) = flags.webhook_port else {
        return Ok(None);
    };
    let target = match (&flags.webhook_service, &flags.webhook_url) {
        (Some(service), None) => WebhookTarget::parse_service(service)
            .map_err(|e| (EXIT_INVALID_INPUT, format!("--webhook-service: {e}")))?,
        (None, Some(url)) if url.starts_with("https://") => WebhookTarget::Url(url.clone()),
        (None, Some(url)) => {
            return Err((
                EXIT_INVALID_INPUT,
                format!("--webhook-url: {url:?} must start with https://"),
            ));
        }
        _ => {
            return Err((
                EXIT_INVALID_INPUT,
                "--webhook-port needs --webhook-service or --webhook-url (how the apiserver reaches it)"
                    .to_owned(),
            ));
        }
    };
    let certificates = match (
        &flags.webhook_cert_file,
        &flags.webhook_key_file,
        &flags.webhook_ca_file,
    ) {
        (Some(cert), Some(key), Some(ca)) => CertificateSource::Files {
            cert: cert.clone(),
            key: key.clone(),
            ca: ca.clone(),
        },
        _ => CertificateSource::Secret {
            namespace: args.lease_namespace.clone(),
            name: flags.webhook_secret.clone(),
        },
    };
    Ok(Some(WebhookSettings {
        address: std::net::SocketAddr::from(([0, 0, 0, 0], port)),
        target,
        certificates,
    }))
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
        .with_writer(std::io::stderr)
        // Colours only on a terminal, not in log files and collectors.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
