//! The `crd-lifecycle` binary: outputs, exit codes and messages.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const EXAMPLE_POLICY: &str = "examples/widgets/policy.yaml";
const EXAMPLE_CRD: &str = "examples/widgets/crd.yaml";

fn run(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or("").as_bytes())
        .expect("write stdin");
    drop(input);
    child.wait_with_output().expect("the binary finishes")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn plan(extra: &[&str]) -> Output {
    let mut args = vec!["plan", "--policy", EXAMPLE_POLICY, "--crd", EXAMPLE_CRD];
    args.extend_from_slice(extra);
    run(&args, None)
}

#[test]
fn plan_yaml_is_the_crd_at_the_instant() {
    let output = plan(&["--at", "2026-07-01T00:00:00Z"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let yaml = text(&output.stdout);
    let (crd, _) = crd_lifecycle::manifest::parse_crd(&yaml, "stdout").expect("a CRD manifest");
    let names: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["v1beta1", "v1"]);
    assert!(crd.status.is_none());
}

#[test]
fn plan_json_and_stdin() {
    let policy = crate::fixtures::EXAMPLE_POLICY;
    let output = run(
        &[
            "plan",
            "--policy",
            "-",
            "--crd",
            EXAMPLE_CRD,
            "--at",
            "2026-02-01T00:00:00Z",
            "-o",
            "json",
        ],
        Some(policy),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(json["spec"]["versions"][2]["name"], "v1");
    assert_eq!(json["spec"]["versions"][2]["storage"], true);
    assert_eq!(json["spec"]["versions"][0]["storage"], false);
}

#[test]
fn plan_table_shows_timeline_and_versions() {
    let output = plan(&["--at", "2026-04-15T00:00:00Z", "-o", "table"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let table = text(&output.stdout);
    for expected in [
        "VersionPolicy widgets for CRD widgets.example.com, evaluated at 2026-04-15T00:00:00Z",
        "2026-04-01T00:00:00Z  v1beta1   deprecate  done",
        "2026-05-30T00:00:00Z  v1alpha1  unserve    next, in 45d  90d after deprecate",
        "2026-06-29T00:00:00Z  v1alpha1  remove     upcoming      30d after unserve; after: managedFields cleanup",
        "v1alpha1  Deprecated  yes     no       yes         example.com/v1alpha1 Widget is deprecated; use example.com/v1",
        "v1        Stored      yes     yes      no",
    ] {
        assert!(table.contains(expected), "missing {expected:?} in\n{table}");
    }
}

#[test]
fn plan_table_shows_held_removals() {
    let output = plan(&[
        "--at",
        "2026-07-01T00:00:00Z",
        "-o",
        "table",
        "--stored-versions",
        "v1alpha1,v1",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let table = text(&output.stdout);
    assert!(table.contains("v1alpha1  remove     held"), "{table}");
    assert!(
        table.contains("BLOCKED\n  v1alpha1 remove (AwaitingMigration): removal of v1alpha1 is held"),
        "{table}"
    );
    assert!(
        table.contains("status.storedVersions (given): v1alpha1, v1"),
        "{table}"
    );
}

#[test]
fn warnings_the_apiserver_rejects_exit_2() {
    // The warnings of samples 22 (400 bytes in 200 characters), 23 (empty) and 24 (a
    // non-breaking space at index 3), and a zero-width joiner.
    let long = "é".repeat(200);
    for (warning, expected) in [
        (long.as_str(), "is 400 bytes long in UTF-8 (200 characters)"),
        ("", "must not be an empty string"),
        ("use\\u00a0v1", "non-printable character U+00A0 found at index 3"),
        ("use\\u200dv1", "non-printable character U+200D found at index 3"),
    ] {
        let bad = crate::fixtures::EXAMPLE_POLICY.replace(
            "\"example.com/v1alpha1 Widget is deprecated; use example.com/v1\"",
            &format!("\"{warning}\""),
        );
        assert_ne!(bad, crate::fixtures::EXAMPLE_POLICY);
        let output = run(&["plan", "--policy", "-", "--crd", EXAMPLE_CRD], Some(&bad));
        assert_eq!(output.status.code(), Some(2), "{warning:?}");
        let stderr = text(&output.stderr);
        let line = stderr
            .lines()
            .find(|l| l.trim_start().starts_with("spec.versions[0].deprecate.warning: "))
            .unwrap_or_else(|| panic!("{warning:?}: {stderr}"));
        assert!(line.contains(expected), "{warning:?}: {line}");
    }
}

#[test]
fn invalid_policy_exits_2_naming_every_field() {
    let bad = crate::fixtures::EXAMPLE_POLICY
        .replace("unserve: {after: 90d}", "unserve: {after: 90x}")
        .replace(
            "introduce: {at: \"2026-01-15T00:00:00Z\"}",
            "introduce: {at: \"2026-02-15T00:00:00Z\"}",
        );
    let output = run(&["plan", "--policy", "-", "--crd", EXAMPLE_CRD], Some(&bad));
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty(), "no output on invalid input");
    let stderr = text(&output.stderr);
    assert!(
        stderr.starts_with("error: <stdin>: invalid policy (2 problems):"),
        "{stderr}"
    );
    assert!(
        stderr.contains("spec.versions[0].unserve.after: invalid duration \"90x\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("spec.versions[2].store: store (2026-02-01T00:00:00Z) is before introduce"),
        "{stderr}"
    );
}

#[test]
fn unknown_fields_exit_2() {
    let bad =
        crate::fixtures::EXAMPLE_POLICY.replace("remove: {after: 30d}", "remove: {after: 30d, when: later}");
    let output = run(&["plan", "--policy", "-", "--crd", EXAMPLE_CRD], Some(&bad));
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("spec.versions[0].remove.when: unknown field"),
        "{stderr}"
    );
    assert!(
        stderr.contains("spec.versions[1].remove.when: unknown field"),
        "{stderr}"
    );
}

#[test]
fn other_bad_input_exits_2() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["plan", "--policy", "missing.yaml", "--crd", EXAMPLE_CRD],
            "missing.yaml: cannot read",
        ),
        (
            &["plan", "--policy", EXAMPLE_POLICY, "--crd", EXAMPLE_POLICY],
            "kind: expected \"CustomResourceDefinition\"",
        ),
        (
            &[
                "plan",
                "--policy",
                EXAMPLE_POLICY,
                "--crd",
                EXAMPLE_CRD,
                "--at",
                "soon",
            ],
            "not an RFC 3339 instant",
        ),
        (
            &[
                "plan",
                "--policy",
                EXAMPLE_POLICY,
                "--crd",
                EXAMPLE_CRD,
                "-o",
                "xml",
            ],
            "invalid value 'xml'",
        ),
        (
            &["plan", "--policy", "-", "--crd", "-"],
            "cannot both be read from stdin",
        ),
        (
            &[
                "plan",
                "--policy",
                EXAMPLE_POLICY,
                "--crd",
                EXAMPLE_CRD,
                "--stored-versions",
                "v7",
            ],
            "--stored-versions: \"v7\" is not a version of widgets.example.com",
        ),
    ];
    for (args, expected) in cases {
        let output = run(args, None);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn crd_subcommand_prints_the_checked_in_crd() {
    let output = run(&["crd"], None);
    assert!(output.status.success());
    let checked_in = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/crds/versionpolicy.yaml"))
        .expect("crds/versionpolicy.yaml");
    assert_eq!(
        text(&output.stdout),
        checked_in,
        "run `cargo run -- crd > crds/versionpolicy.yaml`"
    );
}

#[test]
fn plan_table_shows_gates_next_to_their_milestones() {
    let policy = crate::fixtures::EXAMPLE_POLICY
        .replace(
            "store: {at: \"2026-02-01T00:00:00Z\"}",
            "store: {at: \"2026-02-01T00:00:00Z\", approval: Required}",
        )
        .replace(
            "unserve: {after: 120d}",
            "unserve: {after: 120d, requireNoTrafficFor: 24h}",
        );
    let output = run(
        &[
            "plan",
            "--policy",
            "-",
            "--crd",
            EXAMPLE_CRD,
            "--at",
            "2026-01-01T00:00:00Z",
            "-o",
            "table",
        ],
        Some(&policy),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let table = text(&output.stdout);
    for expected in [
        "v1        store      upcoming     gate: approval (crdlifecycle.io/approve=v1.store); gate: conversion preflight",
        "v1beta1   unserve    upcoming     120d after deprecate; gate: no requests for 24h",
    ] {
        assert!(table.contains(expected), "missing {expected:?} in\n{table}");
    }
}

#[test]
fn convert_is_lossless_through_the_binary() {
    let output = run(
        &[
            "convert",
            "--policy",
            "examples/conversion/policy.yaml",
            "--to",
            "v1",
            "examples/conversion/objects.yaml",
        ],
        None,
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let v1 = text(&output.stdout);
    let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(&v1).expect("YAML documents");
    assert_eq!(documents.len(), 3);
    // The type change: spec.port "8080" becomes 8080.
    assert_eq!(
        documents[0]["spec"],
        serde_json::json!({"port": 8080, "color": "blue", "scale": {"replicas": 1}})
    );
    assert_eq!(documents[1]["apiVersion"], "example.com/v1");
    // "08080" becomes 8080 too, its original kept to come back exactly.
    assert_eq!(documents[2]["spec"]["port"], 8080);
    assert!(
        documents[2]["metadata"]["annotations"]["crdlifecycle.io/conversion-data"]
            .as_str()
            .is_some_and(|data| data.contains(r#""spec.port":"08080""#)),
        "{v1}"
    );
    // And back, from stdin, as JSON.
    let output = run(
        &[
            "convert",
            "--policy",
            "examples/conversion/policy.yaml",
            "--to",
            "v1alpha1",
            "-o",
            "json",
        ],
        Some(&v1),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let list: serde_json::Value = serde_json::from_slice(&output.stdout).expect("a JSON List");
    assert_eq!(list["kind"], "List");
    let back = list["items"].as_array().cloned().expect("items");
    let original: Vec<serde_json::Value> = serde_saphyr::from_multiple(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/conversion/objects.yaml"
        ))
        .expect("objects"),
    )
    .expect("YAML");
    assert_eq!(back, original);
}

#[test]
fn convert_reports_objects_it_cannot_convert() {
    let objects = "apiVersion: example.com/v1alpha1\nkind: Gadget\nmetadata: {name: odd, namespace: ns}\nspec: {size: 1, replicas: 2}\n";
    let output = run(
        &[
            "convert",
            "--policy",
            "examples/conversion/policy.yaml",
            "--to",
            "v1",
        ],
        Some(objects),
    );
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(
            "document 1 (Gadget ns/odd): cannot move spec.size to spec.replicas: spec.replicas is already set"
        ),
        "{stderr}"
    );
    let output = run(
        &["convert", "--policy", EXAMPLE_POLICY, "--to", "v1"],
        Some(objects),
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("the policy has no spec.conversion"));
}

#[test]
fn run_exits_non_zero_when_the_metrics_address_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("address").to_string();
    let kubeconfig = std::env::temp_dir().join(format!("crd-lifecycle-cli-{}.yaml", std::process::id()));
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"http://127.0.0.1:9\"}}]\n\
         users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .expect("kubeconfig");
    let output = run(
        &[
            "run",
            "--kubeconfig",
            kubeconfig.to_str().expect("path"),
            "--metrics-addr",
            &address,
        ],
        None,
    );
    let _ = std::fs::remove_file(&kubeconfig);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("cannot serve metrics and probes on the --metrics-addr address"),
        "{stderr}"
    );
}

#[test]
fn rbac_prints_the_labelled_cluster_role_a_crd_needs() {
    let output = run(&["rbac", "widgets.example.com"], None);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let role: serde_json::Value = serde_saphyr::from_str(&text(&output.stdout)).expect("YAML");
    assert_eq!(role["kind"], "ClusterRole");
    assert_eq!(
        role["metadata"]["name"],
        "crd-lifecycle-migrator-widgets.example.com"
    );
    assert_eq!(
        role["metadata"]["labels"]["crdlifecycle.io/aggregate-to-migrator"],
        "true"
    );
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get", "list", "patch"]}])
    );

    // From a policy that rewrites through /status: patch on the status subresource too.
    let policy = std::fs::read_to_string(format!("{}/{EXAMPLE_POLICY}", env!("CARGO_MANIFEST_DIR")))
        .expect("example")
        .replace("  migration:\n", "  migration:\n    subresource: status\n");
    assert!(
        policy.contains("subresource: status"),
        "the example has a migration section"
    );
    let output = run(&["rbac", "--policy", "-"], Some(&policy));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let role: serde_json::Value = serde_saphyr::from_str(&text(&output.stdout)).expect("YAML");
    assert_eq!(
        role["rules"][1]["resources"],
        serde_json::json!(["widgets/status"])
    );
    assert_eq!(role["rules"][1]["verbs"], serde_json::json!(["patch"]));

    let output = run(&["rbac", "widgets"], None);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("is not a CRD name"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn plan_markdown_is_the_lifecycle_page_and_does_not_depend_on_the_instant() {
    let page = |at: &str| {
        let output = run(
            &[
                "plan",
                "--policy",
                "examples/conversion/policy.yaml",
                "--crd",
                "examples/conversion/crd.yaml",
                "-o",
                "markdown",
                "--at",
                at,
            ],
            None,
        );
        assert!(output.status.success(), "{}", text(&output.stderr));
        text(&output.stdout)
    };
    let markdown = page("2026-01-01T00:00:00Z");
    assert_eq!(
        markdown,
        page("2027-06-01T12:00:00Z"),
        "the same page at any instant"
    );
    for expected in [
        "# Lifecycle of `gadgets.example.com`\n",
        "| Version | Introduced | Stored | Deprecated | Unserved | Removed |\n",
        "| `v1alpha1` | — | — | 2026-03-01 | 2026-03-31 | 2026-04-30 |\n",
        "| `v1` | 2026-01-15 | 2026-02-01 | — | — | — |\n",
        "- `v1alpha1`: `example.com/v1alpha1 Gadget is deprecated; use example.com/v1`\n",
        "### `v1alpha1` → `v1beta1`\n",
        "- renamed `spec.size` → `spec.replicas`\n",
        "- added `spec.color` (default `blue`)\n",
        "- removed `spec.legacyMode`\n",
        "- changed `spec.port`: upgrade `int(self)`, downgrade `string(self)`\n",
        "(conversion preflight)",
    ] {
        assert!(markdown.contains(expected), "missing {expected:?} in\n{markdown}");
    }
    // The checked-in page is what plan renders (regenerate: scripts/check-docs.sh --update).
    let checked_in = std::fs::read_to_string(format!(
        "{}/examples/conversion/LIFECYCLE.md",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("examples/conversion/LIFECYCLE.md");
    assert_eq!(checked_in, markdown);
}

#[test]
fn plan_markdown_lists_the_gates() {
    let policy = std::fs::read_to_string(format!("{}/{EXAMPLE_POLICY}", env!("CARGO_MANIFEST_DIR")))
        .expect("example")
        .replace(
            "    store: {at: \"2026-02-01T00:00:00Z\"}",
            "    store: {at: \"2026-02-01T00:00:00Z\", approval: Required}",
        )
        .replace(
            "    unserve: {after: 90d}",
            "    unserve: {after: 90d, requireNoTrafficFor: 24h}",
        );
    assert!(
        policy.contains("approval: Required") && policy.contains("requireNoTrafficFor"),
        "{policy}"
    );
    let output = run(
        &["plan", "--policy", "-", "--crd", EXAMPLE_CRD, "-o", "markdown"],
        Some(&policy),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let markdown = text(&output.stdout);
    assert!(
        markdown.contains("- `v1` store waits for an approval: `kubectl annotate vp widgets\n  crdlifecycle.io/approve=v1.store`."),
        "{markdown}"
    );
    assert!(
        markdown.contains("- `v1alpha1` unserve waits until no client has called it for 24h."),
        "{markdown}"
    );
}

#[test]
fn plan_and_convert_refuse_a_type_change_that_does_not_compile() {
    refuse_upgrade(
        "int(",
        "spec.conversion.changes[1].changed[0].upgrade: does not compile",
    );
    // A misspelled function is caught when the policy is read, not at every conversion.
    refuse_upgrade(
        "int(self.lowerascii())",
        "spec.conversion.changes[1].changed[0].upgrade: unknown function lowerascii (did you mean lowerAscii?)",
    );
    refuse_upgrade(
        "self.replace('a')",
        "spec.conversion.changes[1].changed[0].upgrade: replace takes 2 or 3 argument(s), not 1",
    );
}

/// `plan`, `convert` and `webhook` exit 2 naming `problem` for the example policy with
/// `upgrade` as its type change.
fn refuse_upgrade(upgrade: &str, problem: &str) {
    let policy = std::fs::read_to_string(format!(
        "{}/examples/conversion/policy.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("example")
    .replace("upgrade: \"int(self)\"", &format!("upgrade: \"{upgrade}\""));
    assert!(policy.contains(upgrade), "{policy}");
    for args in [
        &["webhook", "--policy", "-", "--port", "0"][..],
        &["plan", "--policy", "-", "--crd", "examples/conversion/crd.yaml"][..],
        &[
            "convert",
            "--policy",
            "-",
            "--to",
            "v1",
            "examples/conversion/objects.yaml",
        ][..],
    ] {
        let output = run(args, Some(&policy));
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(problem), "{args:?}: {stderr}");
    }
}

#[test]
fn plan_table_says_which_engine_migrates_after_each_store() {
    let output = plan(&["--at", "2026-06-29T00:00:00Z", "-o", "table"]);
    let table = text(&output.stdout);
    assert!(
        table.contains("gate: conversion preflight; migration: Internal"),
        "{table}"
    );
    let policy = std::fs::read_to_string(format!("{}/{EXAMPLE_POLICY}", env!("CARGO_MANIFEST_DIR")))
        .expect("example")
        .replace(
            "  migration:\n",
            "  migration:\n    engine: StorageVersionMigration\n",
        );
    assert!(policy.contains("engine: StorageVersionMigration"), "{policy}");
    let output = run(
        &[
            "plan",
            "--policy",
            "-",
            "--crd",
            EXAMPLE_CRD,
            "--at",
            "2026-06-29T00:00:00Z",
            "-o",
            "table",
        ],
        Some(&policy),
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("migration: StorageVersionMigration (built-in)"),
        "{}",
        text(&output.stdout)
    );
}

/// `plan -o table` shows a configured preflight lead; `plan` refuses an invalid one naming
/// its field.
#[test]
fn plan_shows_the_preflight_lead_and_refuses_a_bad_one() {
    let example =
        std::fs::read_to_string(format!("{}/{EXAMPLE_POLICY}", env!("CARGO_MANIFEST_DIR"))).expect("example");
    let with_lead = |lead: &str| {
        example.replace(
            "  migration:\n",
            &format!("  migration:\n    preflightLead: {lead}\n"),
        )
    };
    let args = [
        "plan",
        "--policy",
        "-",
        "--crd",
        EXAMPLE_CRD,
        "--at",
        "2026-06-29T00:00:00Z",
        "-o",
        "table",
    ];
    let output = run(&args, Some(&with_lead("15m")));
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("gate: conversion preflight (starts 15m before)"),
        "{}",
        text(&output.stdout)
    );
    let output = run(&args, Some(&with_lead("soon")));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("spec.migration.preflightLead"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn check_exits_2_for_input_it_cannot_read_before_any_cluster() {
    // No cluster is reached: the input is read first (an unreachable kubeconfig would be 2 too,
    // but the message must be about the file).
    let missing = run(&["check", "-f", "no/such/crds.yaml"], None);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        text(&missing.stderr).contains("no/such/crds.yaml: cannot read"),
        "{}",
        text(&missing.stderr)
    );
    let none = run(
        &["check", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"),
    );
    assert_eq!(none.status.code(), Some(2));
    assert!(
        text(&none.stderr).contains("<stdin>: no CustomResourceDefinition found"),
        "{}",
        text(&none.stderr)
    );
    let crd = std::fs::read_to_string(format!("{}/{EXAMPLE_CRD}", env!("CARGO_MANIFEST_DIR"))).expect("crd");
    let invalid = run(
        &["check", "-f", "-"],
        Some(&format!(
            "{}---\n{}",
            "apiVersion: v1\nkind: Service\n",
            crd.replace("scope: Namespaced", "scope: Namespaced\n  scoped: yes")
        )),
    );
    assert_eq!(invalid.status.code(), Some(2));
    let stderr = text(&invalid.stderr);
    assert!(
        stderr.contains("<stdin>#2: not a valid CustomResourceDefinition:")
            && stderr.contains("spec.scoped: unknown field"),
        "{stderr}"
    );
    let usage = run(&["check"], None);
    assert_eq!(usage.status.code(), Some(2), "-f is required");
}
