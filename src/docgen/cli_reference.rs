//! The command-line reference, walked from the clap definitions (`cli::Cli`): every visible
//! subcommand with its description, usage and every option (help, default, environment
//! variable, possible values).

use clap::{Arg, ArgAction, Command, CommandFactory};

use super::markdown::{anchor, cell, sentence, wrap};
use crate::cli::Cli;

/// The page `reference/cli.md`.
pub(super) fn render() -> String {
    let mut root = Cli::command();
    root.build();
    let name = root.get_name().to_owned();
    let mut page = String::from("# Command-line reference\n\n");
    page.push_str(&super::generated_from("the clap definitions in `src/cli.rs`"));
    page.push('\n');
    page.push_str(&wrap(&format!(
        "`{name} <command> [flags]`: {}. Every command has `--help`; the binary also runs as the \
         kubectl plugin `kubectl crd-lifecycle` ([the kubectl plugin](../guides/kubectl-plugin.md)). \
         Flags of long-running commands also read the environment variables named below. \
         The same text as manual pages: `docs/man/` (`man -l docs/man/crd-lifecycle-plan.1`).",
        root.get_about()
            .map(|a| a.to_string())
            .unwrap_or_default()
            .trim_end_matches('.')
    )));
    page.push_str("\n\n");
    let commands: Vec<&Command> = root
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .collect();
    page.push_str("| command | what it does |\n| --- | --- |\n");
    for command in &commands {
        let title = format!("{name} {}", command.get_name());
        page.push_str(&format!(
            "| [`{}`](#{}) | {} |\n",
            command.get_name(),
            anchor(&title),
            cell(&sentence(&about(command)))
        ));
    }
    let globals: Vec<&Arg> = root
        .get_arguments()
        .filter(|a| a.is_global_set() && visible(a))
        .collect();
    if !globals.is_empty() {
        page.push_str("\n## Global options\n\nEvery command takes these.\n\n");
        page.push_str(&options_table(&globals));
    }
    for command in commands {
        page.push_str(&format!("\n## `{name} {}`\n\n", command.get_name()));
        let description = command
            .get_long_about()
            .or(command.get_about())
            .map(|a| a.to_string())
            .unwrap_or_default();
        page.push_str(&wrap(&sentence(&description)));
        page.push_str("\n\n```text\n");
        let usage = command.clone().render_usage().to_string();
        page.push_str(usage.trim_end());
        page.push_str("\n```\n\n");
        let arguments: Vec<&Arg> = command
            .get_arguments()
            .filter(|a| visible(a) && !globals.iter().any(|g| g.get_id() == a.get_id()))
            .collect();
        if arguments.is_empty() {
            page.push_str("No options besides the global ones.\n");
        } else {
            page.push_str(&options_table(&arguments));
        }
    }
    page
}

/// A possible value's help inside a sentence.
fn lower_first(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| c.to_lowercase().chain(chars).collect())
        .unwrap_or_default()
}

fn about(command: &Command) -> String {
    command.get_about().map(|a| a.to_string()).unwrap_or_default()
}

/// Arguments a user sees: not hidden, and not clap's own `--help` / `--version`.
fn visible(arg: &Arg) -> bool {
    !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version")
}

fn options_table(arguments: &[&Arg]) -> String {
    let mut table = String::from("| option | description |\n| --- | --- |\n");
    for arg in arguments {
        table.push_str(&format!(
            "| {} | {} |\n",
            cell(&synopsis(arg)),
            cell(&details(arg))
        ));
    }
    table
}

/// `-o, --output <FORMAT>`, `--fix`, or `<CRD_NAME>` for a positional argument.
fn synopsis(arg: &Arg) -> String {
    let values = arg
        .get_value_names()
        .map(|names| {
            names
                .iter()
                .map(|n| format!("<{n}>"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("<{}>", arg.get_id().as_str().to_uppercase()));
    let takes_value = arg.get_action().takes_values();
    let mut flags = Vec::new();
    if let Some(short) = arg.get_short() {
        flags.push(format!("-{short}"));
    }
    if let Some(long) = arg.get_long() {
        flags.push(format!("--{long}"));
    }
    let text = match (flags.is_empty(), takes_value) {
        (true, _) => values,
        (false, true) => format!("{} {values}", flags.join(", ")),
        (false, false) => flags.join(", "),
    };
    format!("`{text}`")
}

/// The help text, then what is required, repeatable, defaulted, read from the environment,
/// and the possible values.
fn details(arg: &Arg) -> String {
    let mut parts = Vec::new();
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    if !help.is_empty() {
        parts.push(sentence(&help));
    }
    if arg.is_required_set() {
        parts.push("Required.".to_owned());
    }
    if matches!(arg.get_action(), ArgAction::Append) {
        parts.push("Repeatable.".to_owned());
    }
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| match v.get_help() {
            Some(help) => format!(
                "`{}` ({})",
                v.get_name(),
                lower_first(help.to_string().trim_end_matches('.'))
            ),
            None => format!("`{}`", v.get_name()),
        })
        .collect();
    let flag_only = !arg.get_action().takes_values();
    if !values.is_empty() && !flag_only {
        parts.push(format!("Values: {}.", values.join(", ")));
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|d| format!("`{}`", d.to_string_lossy()))
        .collect();
    if !defaults.is_empty() && !flag_only {
        parts.push(format!("Default: {}.", defaults.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        parts.push(format!("Environment: `{}`.", env.to_string_lossy()));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_visible_command_and_flag_is_on_the_page() {
        let page = super::render();
        for command in ["plan", "run", "migrate", "check", "repair-managed-fields", "rbac"] {
            assert!(
                page.contains(&format!("## `crd-lifecycle {command}`")),
                "{command}"
            );
        }
        assert!(
            !page.contains("## `crd-lifecycle docgen`"),
            "the hidden command stays hidden"
        );
        assert!(
            page.contains("`--kubeconfig <FILE>`"),
            "a subcommand's own global flags"
        );
        for flag in [
            "--webhook-idle-grace",
            "--replaced-manager",
            "--stored-versions",
            "--log-format",
        ] {
            assert!(page.contains(flag), "{flag}");
        }
        assert!(
            page.contains("`CRD_LIFECYCLE_WEBHOOK_DRAIN`"),
            "environment variables"
        );
    }
}
