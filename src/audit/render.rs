//! The audit as people (table, markdown) and programs (JSON) read it.

use super::CrdAudit;

/// How `audit` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditFormat {
    Table,
    Json,
    Markdown,
}

/// Renders the audits.
pub fn render(audits: &[CrdAudit], format: AuditFormat) -> String {
    match format {
        AuditFormat::Json => {
            let mut text =
                serde_json::to_string_pretty(&serde_json::json!({ "crds": audits })).unwrap_or_default();
            text.push('\n');
            text
        }
        AuditFormat::Table => table(audits),
        AuditFormat::Markdown => markdown(audits),
    }
}

fn with_problems(audits: &[CrdAudit]) -> Vec<&CrdAudit> {
    audits.iter().filter(|a| !a.problems.is_empty()).collect()
}

fn table(audits: &[CrdAudit]) -> String {
    let flagged = with_problems(audits);
    let mut out = format!("{} CRDs audited, {} with problems\n", audits.len(), flagged.len());
    if flagged.is_empty() {
        return out;
    }
    let mut rows = vec![[
        "CRD".to_owned(),
        "STORAGE".to_owned(),
        "STORED VERSIONS".to_owned(),
        "OBJECTS".to_owned(),
        "GOVERNED BY".to_owned(),
        "PROBLEMS".to_owned(),
    ]];
    for audit in &flagged {
        let kinds: Vec<String> = audit
            .problems
            .iter()
            .map(|p| format!("{} {}", p.kind, p.version))
            .collect();
        rows.push([
            audit.name.clone(),
            audit.storage_version.clone().unwrap_or_else(|| "-".into()),
            audit.stored_versions.join(","),
            audit.objects.to_string(),
            audit.governed_by.clone().unwrap_or_else(|| "-".into()),
            kinds.join(", "),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    out.push('\n');
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| format!("{cell:<width$}", width = widths[i]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    for audit in flagged {
        out.push_str(&format!("\n{}\n", audit.name));
        for problem in &audit.problems {
            out.push_str(&format!(
                "  {} {}: {}\n",
                problem.kind, problem.version, problem.message
            ));
        }
    }
    out
}

fn markdown(audits: &[CrdAudit]) -> String {
    let flagged = with_problems(audits);
    let mut out = format!(
        "# CRD audit\n\n{} CRDs audited, {} with problems.\n",
        audits.len(),
        flagged.len()
    );
    if flagged.is_empty() {
        return out;
    }
    out.push_str("\n| CRD | storage | storedVersions | objects | governed by | problems |\n");
    out.push_str("| --- | --- | --- | --- | --- | --- |\n");
    for audit in &flagged {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            audit.name,
            audit.storage_version.as_deref().unwrap_or("—"),
            audit.stored_versions.join(", "),
            audit.objects,
            audit.governed_by.as_deref().unwrap_or("—"),
            audit.problems.len()
        ));
    }
    for audit in flagged {
        out.push_str(&format!("\n## `{}`\n\n", audit.name));
        for problem in &audit.problems {
            out.push_str(&format!(
                "- **{}** `{}`: {}\n",
                problem.kind,
                problem.version,
                problem.message.replace('|', "\\\\|")
            ));
        }
    }
    out
}
