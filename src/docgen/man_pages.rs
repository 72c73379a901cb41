//! The manual pages, from the clap definitions (`cli::Cli`) through clap_mangen: one for
//! `crd-lifecycle` and one for each visible subcommand (`crd-lifecycle-plan.1`, ...), so that
//! a package can install them and `man crd-lifecycle-check` works.

use clap::{Command, CommandFactory};

use crate::cli::Cli;

/// Every page: its file name (`crd-lifecycle.1`, `crd-lifecycle-<command>.1`) and its roff.
pub(super) fn render() -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut root = Cli::command().disable_help_subcommand(true);
    root.build();
    let mut pages = Vec::new();
    collect(&root, &mut pages)?;
    Ok(pages)
}

fn collect(command: &Command, pages: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(command.clone());
    let mut text = Vec::new();
    man.render(&mut text)?;
    pages.push((man.get_filename(), text));
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub, pages)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A page for the binary and one per visible subcommand, named as `man` looks them up;
    /// none for the hidden `docgen`.
    #[test]
    fn one_page_per_visible_command() {
        let pages = super::render().expect("renders");
        let names: Vec<&str> = pages.iter().map(|(name, _)| name.as_str()).collect();
        assert!(names.contains(&"crd-lifecycle.1"), "{names:?}");
        assert!(names.contains(&"crd-lifecycle-plan.1"), "{names:?}");
        assert!(names.contains(&"crd-lifecycle-check.1"), "{names:?}");
        assert!(!names.iter().any(|n| n.contains("docgen")), "{names:?}");
        let plan = pages
            .iter()
            .find(|(name, _)| name == "crd-lifecycle-plan.1")
            .map(|(_, text)| String::from_utf8_lossy(text).into_owned())
            .unwrap_or_default();
        assert!(plan.starts_with(".ie"), "{plan}");
        assert!(plan.contains("crd\\-lifecycle\\-plan"), "{plan}");
    }
}
