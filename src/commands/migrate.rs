//! `crd-lifecycle migrate` and `crd-lifecycle repair-managed-fields`: the migrator with a
//! progress display.

use crd_lifecycle::kubeclient;
use crd_lifecycle::migrate::{self, Mode};

use super::CommandError;
use crate::cli::{MigrateArgs, PacingArgs, RepairArgs};

pub async fn migrate(args: MigrateArgs) -> Result<(), CommandError> {
    let client = kubeclient::client(&args.cluster)
        .await
        .map_err(CommandError::failed)?;
    let settings = migrate::Settings {
        mode: if args.dry_run {
            Mode::Preflight
        } else {
            Mode::Rewrite
        },
        through_status: args.subresource.is_some(),
        ..pacing(&args.pacing)
    };
    run_with_progress(&client, &args.crd, &settings).await
}

pub async fn repair(args: RepairArgs) -> Result<(), CommandError> {
    let client = kubeclient::client(&args.cluster)
        .await
        .map_err(CommandError::failed)?;
    let settings = migrate::Settings {
        mode: Mode::CleanManagedFields,
        managed_fields: migrate::ManagedFieldsCleanup {
            versions: None,
            conversion: None,
            dry_run: args.dry_run,
        },
        ..pacing(&args.pacing)
    };
    run_with_progress(&client, &args.crd, &settings).await
}

/// The settings every run of the migrator takes from the command line.
pub(super) fn pacing(args: &PacingArgs) -> migrate::Settings {
    migrate::Settings {
        concurrency: usize::try_from(args.concurrency).unwrap_or(16),
        page_size: args.page_size,
        qps: args.qps,
        request_timeout: std::time::Duration::from_secs(args.request_timeout),
        ..migrate::Settings::default()
    }
}

/// Runs the migrator with a progress display, prints the summary and the first failures,
/// and maps the outcome to the exit code (0 done, 1 failures, 2 a missing CRD).
async fn run_with_progress(
    client: &kube::Client,
    crd: &str,
    settings: &migrate::Settings,
) -> Result<(), CommandError> {
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
            Err(CommandError::Failed(format!("{what} did not complete")))
        }
        Err(error @ (migrate::Error::CrdNotFound(_) | migrate::Error::MissingPermission(_))) => {
            Err(CommandError::InvalidInput(error.to_string()))
        }
        Err(error) => Err(CommandError::Failed(error.to_string())),
    }
}
