//! `crd-lifecycle audit`.

use std::io::Write;

use crd_lifecycle::audit::{self, AuditFormat, AuditSettings};
use crd_lifecycle::kubeclient;

use super::CommandError;
use crate::cli::{AuditArgs, AuditOutput};

pub async fn run(args: AuditArgs) -> Result<(), CommandError> {
    let client = kubeclient::client(&args.cluster)
        .await
        .map_err(CommandError::invalid)?;
    let settings = AuditSettings {
        crds: args.crd.clone(),
        page_size: args.page_size,
        concurrency: args.concurrency,
    };
    let audits = audit::run(&client, &settings)
        .await
        .map_err(CommandError::invalid)?;
    let format = match args.output {
        AuditOutput::Table => AuditFormat::Table,
        AuditOutput::Json => AuditFormat::Json,
        AuditOutput::Markdown => AuditFormat::Markdown,
    };
    std::io::stdout()
        .write_all(audit::render(&audits, format).as_bytes())
        .map_err(CommandError::failed)?;
    let problems: usize = audits.iter().map(|a| a.problems.len()).sum();
    if problems > 0 {
        // Exit 1, printing nothing more: the report says it all.
        return Err(CommandError::Failed(format!("{problems} problems found")));
    }
    Ok(())
}
