//! `crd-lifecycle plan`.

use crd_lifecycle::plan::{self, OutputFormat, PlanSettings};

use super::CommandError;
use crate::cli;

pub fn run(args: &cli::PlanArgs) -> Result<(), CommandError> {
    let settings = PlanSettings {
        policy: args.policy.clone(),
        crd: args.crd.clone(),
        at: args.at,
        stored_versions: args.stored_versions.clone(),
        output: match args.output {
            cli::OutputFormat::Yaml => OutputFormat::Yaml,
            cli::OutputFormat::Json => OutputFormat::Json,
            cli::OutputFormat::Table => OutputFormat::Table,
            cli::OutputFormat::Markdown => OutputFormat::Markdown,
        },
    };
    plan::run(&settings, &mut std::io::stdout().lock()).map_err(CommandError::invalid)
}
