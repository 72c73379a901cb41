//! `crd-lifecycle check`: the incoming CRDs against one or more clusters, and `--fix`.

use std::io::{IsTerminal, Write};

use crd_lifecycle::check::{
    self, CheckFormat, CheckSettings, ClusterReport, FixObserver, FixSettings, ReadSettings,
};
use crd_lifecycle::kubeclient::{self, ClusterArgs};
use crd_lifecycle::migrate;

use super::CommandError;
use crate::cli::{AuditOutput, CheckArgs};

pub async fn run(args: CheckArgs) -> Result<(), CommandError> {
    let incoming = check::read_incoming(&args.files).map_err(CommandError::invalid)?;
    let settings = CheckSettings {
        read: ReadSettings {
            page_size: args.pacing.page_size,
            max_named: args.max_objects,
            request_timeout: std::time::Duration::from_secs(args.pacing.request_timeout),
        },
        concurrency: args.parallel_crds as usize,
        writers_window: args.writers_window,
        replaced_managers: args.replaced_managers.clone(),
    };
    let observer = Progress {
        terminal: std::io::stderr().is_terminal(),
    };
    let fix = args.fix.then(|| FixSettings {
        migrate: super::migrate::pacing(&args.pacing),
        observer: &observer,
    });
    let mut clusters = Vec::new();
    for context in contexts(&args)? {
        let cluster = ClusterArgs {
            kubeconfig: args.kubeconfig.clone(),
            context: context.clone(),
        };
        let report = match kubeclient::client(&cluster).await {
            Ok(client) => check::run(&client, context, &incoming, &settings, fix.as_ref()).await,
            Err(error) => ClusterReport {
                context,
                server_version: None,
                error: Some(format!("cannot use this context: {error}")),
                crds: Vec::new(),
                fixes: Vec::new(),
            },
        };
        clusters.push(report);
    }
    let report = check::Report::new(incoming.crds.len(), incoming.skipped, clusters);
    let format = match args.output {
        AuditOutput::Table => CheckFormat::Table,
        AuditOutput::Json => CheckFormat::Json,
        AuditOutput::Markdown => CheckFormat::Markdown,
    };
    std::io::stdout()
        .write_all(check::render(&report, format).as_bytes())
        .map_err(CommandError::failed)?;
    match report.exit_code() {
        0 => Ok(()),
        1 => Err(CommandError::Failed(
            "the incoming CRDs would be rejected or break clients or data (see above)".to_owned(),
        )),
        _ => Err(CommandError::InvalidInput(
            "could not check everything (see the ERROR and UNCHECKED lines above)".to_owned(),
        )),
    }
}

/// The contexts to check: `None` for the current one.
fn contexts(args: &CheckArgs) -> Result<Vec<Option<String>>, CommandError> {
    if !args.all_contexts {
        if args.context.is_empty() {
            return Ok(vec![None]);
        }
        return Ok(args.context.iter().cloned().map(Some).collect());
    }
    let config = match &args.kubeconfig {
        Some(path) => kube::config::Kubeconfig::read_from(path),
        None => kube::config::Kubeconfig::read(),
    }
    .map_err(|e| CommandError::InvalidInput(format!("--all-contexts: cannot read the kubeconfig: {e}")))?;
    if config.contexts.is_empty() {
        return Err(CommandError::InvalidInput(
            "--all-contexts: the kubeconfig has no contexts".to_owned(),
        ));
    }
    Ok(config.contexts.into_iter().map(|c| Some(c.name)).collect())
}

/// `check --fix`'s progress: the migrator's bar on a terminal, its periodic lines
/// otherwise, and one line per step and CRD on stderr.
struct Progress {
    terminal: bool,
}

/// The migrator's display, cleared when the run ends.
struct Display(migrate::command::ProgressDisplay);

impl Drop for Display {
    fn drop(&mut self) {
        self.0.finish();
    }
}

impl migrate::Observer for Display {
    fn started(&self, target: &migrate::Target, counts: &migrate::Counts) {
        self.0.started(target, counts);
    }

    fn progress(&self, counts: &migrate::Counts, total: Option<u64>) {
        self.0.progress(counts, total);
    }

    fn restarted(&self, reason: &str) {
        self.0.restarted(reason);
    }

    fn continued(&self, reason: &str) {
        self.0.continued(reason);
    }
}

impl FixObserver for Progress {
    fn migrator(&self, crd: &str) -> Box<dyn migrate::Observer> {
        Box::new(Display(migrate::command::ProgressDisplay::for_stderr(crd)))
    }

    fn note(&self, crd: &str, line: &str) {
        if self.terminal {
            eprintln!("{crd}: {line}");
        } else {
            eprintln!("check --fix {crd}: {line}");
        }
    }
}
