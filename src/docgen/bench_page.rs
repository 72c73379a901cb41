//! The page of the benchmarks on a real control plane, rendered from the output of
//! `scripts/bench-real.sh --save` (`docs/bench/real.txt`): its date, machine and server, the
//! summary's figures beside their targets, the notes kept with it (`# ` lines), and the raw
//! output.

use super::markdown::{row, wrap, wrap_at};

/// The page `internals/benchmarks-real.md`, or what is missing from the results.
pub(super) fn render(results: &str) -> Result<String, String> {
    let field = |prefix: &str| {
        results
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .next_back()
            .map(str::trim)
    };
    let date = field("date:").ok_or("no `date:` line (scripts/bench-real.sh prints one)")?;
    let machine = field("machine:").ok_or("no `machine:` line")?;
    let server = field("control plane:")
        .or_else(|| field("server:"))
        .ok_or("no `control plane:` or `server:` line")?;
    let figures = summary(results)?;
    let notes: Vec<&str> = results.lines().filter_map(|l| l.strip_prefix("# ")).collect();

    let mut page = String::from("# Benchmarks on a real control plane\n\n");
    page.push_str(&super::generated_from("`docs/bench/real.txt`"));
    page.push('\n');
    page.push_str(&wrap(&format!(
        "`scripts/bench-real.sh` runs `cargo bench --bench real` on a control plane started from \
         `KUBEBUILDER_ASSETS` (the e2e suite's harness) and prints each figure beside its target; \
         the figures gate nothing. `scripts/bench-real.sh --save` keeps its output in \
         `docs/bench/real.txt`, which this page is rendered from. What each figure measures is in \
         [benchmarks](benchmarks.md).\n\nLast run: **{date}**. Control plane: {server}. \
         Machine: {machine}."
    )));
    page.push_str("\n\n| figure | measured | target | met |\n| --- | --- | --- | --- |\n");
    for figure in &figures {
        page.push_str(&row(figure));
    }
    if !notes.is_empty() {
        page.push_str("\nNotes on this run:\n\n");
        for note in notes {
            let wrapped = wrap_at(note, 98).replace('\n', "\n  ");
            page.push_str(&format!("- {wrapped}\n"));
        }
    }
    page.push_str("\n## Raw output\n\n```text\n");
    for line in results.lines().filter(|l| !l.starts_with("# ")) {
        page.push_str(line.trim_end());
        page.push('\n');
    }
    page.push_str("```\n");
    Ok(page)
}

/// The rows of the summary table: figure, measured, target, met. Columns are separated by
/// two or more spaces (the bench pads them); a figure without a target has two.
fn summary(results: &str) -> Result<Vec<[String; 4]>, String> {
    let mut lines = results.lines().skip_while(|l| !l.starts_with("summary"));
    lines.next().ok_or("no `summary` section (an incomplete run?)")?;
    let header = lines.next().unwrap_or_default();
    if !header.starts_with("figure") {
        return Err(format!(
            "the summary's header is {header:?}, not `figure measured target met`"
        ));
    }
    let mut rows = Vec::new();
    for line in lines.take_while(|l| !l.trim().is_empty() && !l.starts_with("# ")) {
        let columns: Vec<String> = line
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect();
        let row = match columns.as_slice() {
            [name, value] => [name.clone(), value.clone(), String::new(), String::new()],
            [name, value, target] => [name.clone(), value.clone(), target.clone(), String::new()],
            [name, value, target, met] => [name.clone(), value.clone(), target.clone(), met.clone()],
            _ => return Err(format!("cannot read the summary line {line:?}")),
        };
        rows.push(row);
    }
    if rows.is_empty() {
        return Err("the summary has no figures".to_owned());
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_checked_in_results() {
        let page = super::render(include_str!("../../docs/bench/real.txt")).expect("renders");
        assert!(page.contains("Last run: **"), "{page}");
        assert!(page.contains("| ≥ 1.00x |"), "{page}");
    }

    #[test]
    fn says_what_is_missing() {
        let error = super::render("machine: x\nserver: y\n").expect_err("no date");
        assert!(error.contains("date:"), "{error}");
    }
}
