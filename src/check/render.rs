//! The check as people (a table, blocking lines first; Markdown for a pull request) and
//! programs (JSON, stable: docs/src/guides/upgrade-check.md) read it.

use serde::Serialize;

use super::findings::{CrdCheck, FixPlan, Severity};
use super::fix::StepResult;

/// What `--fix` did for one CRD.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrdFix {
    pub crd: String,
    #[serde(flatten)]
    pub plan: FixPlan,
    pub results: Vec<StepResult>,
}

impl CrdFix {
    /// Refused, or a step failed.
    pub fn failed(&self) -> bool {
        !self.plan.refusals.is_empty() || self.results.iter().any(|r| !r.done)
    }
}

/// One cluster's check.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReport {
    /// The kubeconfig context (`None`: the current one).
    pub context: Option<String>,
    /// The apiserver's version, e.g. `1.36`.
    pub server_version: Option<String>,
    /// Why the cluster could not be checked at all.
    pub error: Option<String>,
    /// After `--fix`: the CRDs as checked again.
    pub crds: Vec<CrdCheck>,
    /// With `--fix`: what was done, or refused, per CRD that needed it.
    pub fixes: Vec<CrdFix>,
}

impl ClusterReport {
    fn label(&self) -> String {
        self.context
            .clone()
            .unwrap_or_else(|| "current context".to_owned())
    }

    /// The CRD's state in one word, for the summary table.
    fn state(&self, crd: &str) -> &'static str {
        if self.error.is_some() {
            return "ERROR";
        }
        let Some(check) = self.crds.iter().find(|c| c.name == crd) else {
            return "-";
        };
        match check.worst() {
            Some(Severity::Rejected) => "REJECTED",
            Some(Severity::Breaking) => "BREAKS",
            _ if !check.unchecked.is_empty() => "UNCHECKED",
            _ if !check.live => "NEW",
            _ => "OK",
        }
    }
}

/// Every cluster's check of the incoming CRDs.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The version of this JSON document's shape.
    pub schema_version: u32,
    /// Incoming CRDs checked.
    pub incoming: usize,
    /// Documents that are not CRDs, skipped.
    pub skipped_documents: usize,
    pub clusters: Vec<ClusterReport>,
    pub summary: Summary,
}

/// Counts over every cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// CRD checks (CRDs × clusters) with a Rejected finding.
    pub rejected: usize,
    /// ... with a Breaking finding and none Rejected.
    pub breaking: usize,
    /// ... with only Info findings.
    pub clean: usize,
    /// ... that could not be checked completely, and clusters that could not be checked.
    pub unchecked: usize,
    /// CRDs `--fix` refused or failed to fix.
    pub fix_failed: usize,
}

impl Report {
    pub fn new(incoming: usize, skipped_documents: usize, clusters: Vec<ClusterReport>) -> Report {
        let mut summary = Summary::default();
        for cluster in &clusters {
            if cluster.error.is_some() {
                summary.unchecked += 1;
            }
            for check in &cluster.crds {
                match check.worst() {
                    Some(Severity::Rejected) => summary.rejected += 1,
                    Some(Severity::Breaking) => summary.breaking += 1,
                    _ => summary.clean += 1,
                }
                if !check.unchecked.is_empty() {
                    summary.unchecked += 1;
                }
            }
            summary.fix_failed += cluster.fixes.iter().filter(|f| f.failed()).count();
        }
        Report {
            schema_version: 1,
            incoming,
            skipped_documents,
            clusters,
            summary,
        }
    }

    /// 2 when something could not be checked, 1 when an apply would be refused or break
    /// something (or `--fix` refused or failed), 0 when clean.
    pub fn exit_code(&self) -> u8 {
        let s = &self.summary;
        if s.unchecked > 0 {
            2
        } else if s.rejected + s.breaking + s.fix_failed > 0 {
            1
        } else {
            0
        }
    }

    fn summary_line(&self) -> String {
        let s = &self.summary;
        let skipped = match self.skipped_documents {
            0 => String::new(),
            n => format!(" ({n} other documents skipped)"),
        };
        let mut line = format!(
            "{} CRDs checked on {} cluster{}{skipped}: {} rejected, {} breaking, {} clean",
            self.incoming,
            self.clusters.len(),
            if self.clusters.len() == 1 { "" } else { "s" },
            s.rejected,
            s.breaking,
            s.clean
        );
        if s.unchecked > 0 {
            line.push_str(&format!(", {} could not be checked", s.unchecked));
        }
        if s.fix_failed > 0 {
            line.push_str(&format!(", {} not fixed", s.fix_failed));
        }
        line
    }

    fn crd_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for cluster in &self.clusters {
            for check in &cluster.crds {
                if !names.contains(&check.name) {
                    names.push(check.name.clone());
                }
            }
        }
        names
    }
}

/// How `check` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckFormat {
    Table,
    Json,
    Markdown,
}

/// Renders the report.
pub fn render(report: &Report, format: CheckFormat) -> String {
    match format {
        CheckFormat::Json => {
            let mut text = serde_json::to_string_pretty(report).unwrap_or_default();
            text.push('\n');
            text
        }
        CheckFormat::Table => table(report),
        CheckFormat::Markdown => markdown(report),
    }
}

fn word(severity: Severity) -> &'static str {
    match severity {
        Severity::Rejected => "REJECTED",
        Severity::Breaking => "BREAKS",
        Severity::Info => "INFO",
    }
}

fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i + 1 == row.len() {
                    cell.clone()
                } else {
                    format!("{cell:<width$}", width = widths[i])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn table(report: &Report) -> String {
    let mut out = String::new();
    let several = report.clusters.len() > 1;
    for cluster in &report.clusters {
        if several || cluster.context.is_some() {
            out.push_str(&format!(
                "== {}{}\n",
                cluster.label(),
                cluster
                    .server_version
                    .as_deref()
                    .map(|v| format!(" (Kubernetes {v})"))
                    .unwrap_or_default()
            ));
        }
        if let Some(error) = &cluster.error {
            out.push_str(&format!("ERROR  could not check this cluster: {error}\n\n"));
            continue;
        }
        let mut rows: Vec<Vec<String>> = Vec::new();
        // Blocking lines first, across CRDs; then what could not be checked; then the rest.
        for severity in [Severity::Rejected, Severity::Breaking] {
            for check in &cluster.crds {
                for finding in check.findings.iter().filter(|f| f.severity == severity) {
                    rows.push(finding_row(check, finding));
                }
            }
        }
        for check in &cluster.crds {
            for reason in &check.unchecked {
                rows.push(vec![
                    "UNCHECKED".to_owned(),
                    check.name.clone(),
                    String::new(),
                    reason.clone(),
                ]);
            }
        }
        for fix in &cluster.fixes {
            for refusal in &fix.plan.refusals {
                rows.push(vec![
                    "NOT FIXED".to_owned(),
                    fix.crd.clone(),
                    String::new(),
                    refusal.clone(),
                ]);
            }
            for result in &fix.results {
                rows.push(vec![
                    if result.done { "FIXED" } else { "NOT FIXED" }.to_owned(),
                    fix.crd.clone(),
                    result.step.label(),
                    result.message.replace('\n', " "),
                ]);
            }
        }
        for check in &cluster.crds {
            for finding in check.findings.iter().filter(|f| f.severity == Severity::Info) {
                rows.push(finding_row(check, finding));
            }
        }
        out.push_str(&aligned(&rows));
        if several {
            out.push('\n');
        }
    }
    if several {
        let names = report.crd_names();
        let mut rows = vec![
            std::iter::once("CRD".to_owned())
                .chain(report.clusters.iter().map(ClusterReport::label))
                .collect::<Vec<_>>(),
        ];
        for name in &names {
            rows.push(
                std::iter::once(name.clone())
                    .chain(report.clusters.iter().map(|c| c.state(name).to_owned()))
                    .collect(),
            );
        }
        out.push_str(&aligned(&rows));
        out.push('\n');
    } else if !out.is_empty() && !out.ends_with("\n\n") {
        out.push('\n');
    }
    out.push_str(&report.summary_line());
    out.push('\n');
    out
}

fn finding_row(check: &CrdCheck, finding: &super::findings::Finding) -> Vec<String> {
    vec![
        word(finding.severity).to_owned(),
        check.name.clone(),
        match &finding.version {
            Some(version) => format!("{} {version}", finding.kind),
            None => finding.kind.to_owned(),
        },
        finding.message.clone(),
    ]
}

/// Wraps Markdown text at 80 columns (the docs' lint), continuation lines indented by
/// `indent`; a word longer than a line stays whole.
fn wrap(text: &str, indent: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > 80 {
            out.push_str(line.trim_end());
            out.push('\n');
            line = " ".repeat(indent);
        } else if !line.is_empty() && !line.ends_with(' ') {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// A cell's text in a Markdown table.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn markdown(report: &Report) -> String {
    let mut out = String::from("# crd-lifecycle check\n\n");
    let s = &report.summary;
    let verdict = if s.unchecked > 0 {
        "**Could not check everything.**"
    } else if s.rejected > 0 {
        "**The apiserver would refuse this upgrade.**"
    } else if s.breaking > 0 || s.fix_failed > 0 {
        "**This upgrade breaks clients or data.**"
    } else {
        "Nothing blocks this upgrade."
    };
    out.push_str(&wrap(&format!("{verdict} {}.", report.summary_line()), 0));
    let names = report.crd_names();
    if !names.is_empty() {
        out.push_str("\n| CRD |");
        for cluster in &report.clusters {
            out.push_str(&format!(" {} |", cell(&cluster.label())));
        }
        out.push_str("\n| --- |");
        for _ in &report.clusters {
            out.push_str(" --- |");
        }
        out.push('\n');
        for name in &names {
            out.push_str(&format!("| `{name}` |"));
            for cluster in &report.clusters {
                out.push_str(&format!(" {} |", cluster.state(name)));
            }
            out.push('\n');
        }
    }
    for cluster in &report.clusters {
        if let Some(error) = &cluster.error {
            out.push_str(&format!("\n## {}\n\n", cluster.label()));
            out.push_str(&wrap(
                &format!("Could not check this cluster: {}", cell(error)),
                0,
            ));
            continue;
        }
        for check in &cluster.crds {
            let fix = cluster.fixes.iter().find(|f| f.crd == check.name);
            if check.findings.is_empty() && check.unchecked.is_empty() && fix.is_none() {
                continue;
            }
            out.push_str(&format!("\n## `{}` on {}\n\n", check.name, cluster.label()));
            for finding in &check.findings {
                let severity = match finding.severity {
                    Severity::Rejected => "Rejected",
                    Severity::Breaking => "Breaks clients or data",
                    Severity::Info => "Info",
                };
                let version = finding
                    .version
                    .as_deref()
                    .map(|v| format!(" `{v}`"))
                    .unwrap_or_default();
                out.push_str(&wrap(
                    &format!(
                        "- **{severity}** {}{version}: {}",
                        finding.kind,
                        cell(&finding.message)
                    ),
                    2,
                ));
            }
            for reason in &check.unchecked {
                out.push_str(&wrap(&format!("- **Not checked**: {}", cell(reason)), 2));
            }
            if let Some(fix) = fix {
                for refusal in &fix.plan.refusals {
                    out.push_str(&wrap(&format!("- **Not fixed**: {}", cell(refusal)), 2));
                }
                for result in &fix.results {
                    out.push_str(&wrap(
                        &format!(
                            "- **{}** {}: {}",
                            if result.done { "Fixed" } else { "Not fixed" },
                            result.step.label(),
                            cell(&result.message)
                        ),
                        2,
                    ));
                }
            }
        }
    }
    out
}
