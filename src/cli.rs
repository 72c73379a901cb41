//! Command-line interface. `main.rs` only dispatches on these.

use clap::{Args, Parser, Subcommand, ValueEnum};
use jiff::Timestamp;

/// Runs the life of CustomResourceDefinition versions as code.
#[derive(Parser, Debug)]
#[command(name = "crd-lifecycle", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Render a CRD as a VersionPolicy says it must be at an instant, offline.
    Plan(PlanArgs),
    /// Print the VersionPolicy CustomResourceDefinition (YAML).
    Crd,
}

/// Arguments of `crd-lifecycle plan`.
#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    /// The VersionPolicy manifest (YAML or JSON; `-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub policy: String,

    /// The CustomResourceDefinition manifest it governs (YAML or JSON; `-` for stdin).
    #[arg(long, value_name = "FILE")]
    pub crd: String,

    /// The instant to render, RFC 3339 (e.g. 2026-03-15T00:00:00Z), or `now`.
    #[arg(long, value_name = "RFC3339|now", default_value = "now", value_parser = parse_instant)]
    pub at: Timestamp,

    /// Output: the CRD manifest as YAML or JSON, or a readable timeline.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Yaml)]
    pub output: OutputFormat,

    /// The CRD's status.storedVersions to assume (comma-separated). By default every
    /// migration is assumed to complete the moment its storage switch happens.
    #[arg(long, value_name = "VERSIONS", value_delimiter = ',')]
    pub stored_versions: Option<Vec<String>>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Yaml,
    Json,
    Table,
}

/// Parses `now` or an RFC 3339 instant.
pub fn parse_instant(text: &str) -> Result<Timestamp, String> {
    if text == "now" {
        return Ok(Timestamp::now());
    }
    text.parse()
        .map_err(|e| format!("{text:?} is not an RFC 3339 instant such as 2026-03-15T00:00:00Z: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn plan_parses_every_flag() {
        let cli = Cli::try_parse_from([
            "crd-lifecycle",
            "plan",
            "--policy",
            "p.yaml",
            "--crd",
            "-",
            "--at",
            "2026-03-15T00:00:00Z",
            "-o",
            "table",
            "--stored-versions",
            "v1alpha1,v1",
        ])
        .expect("valid arguments");
        let Command::Plan(args) = cli.command else {
            panic!("not plan")
        };
        assert_eq!(
            args.at,
            "2026-03-15T00:00:00Z".parse::<Timestamp>().expect("instant")
        );
        assert_eq!(args.output, OutputFormat::Table);
        assert_eq!(
            args.stored_versions,
            Some(vec!["v1alpha1".to_owned(), "v1".to_owned()])
        );
    }

    #[test]
    fn rejects_a_bad_instant() {
        let error = Cli::try_parse_from([
            "crd-lifecycle",
            "plan",
            "--policy",
            "p",
            "--crd",
            "c",
            "--at",
            "tomorrow",
        ])
        .expect_err("bad instant");
        assert!(error.to_string().contains("not an RFC 3339 instant"), "{error}");
    }
}
