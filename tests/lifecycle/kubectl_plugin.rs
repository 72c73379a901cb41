//! The binary as a kubectl plugin: installed as `kubectl-crd_lifecycle` on the PATH, real
//! kubectl finds it (`kubectl plugin list`) and runs it (`kubectl crd-lifecycle ...`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A directory holding the built binary as `kubectl-crd_lifecycle`, as the kubectl plugin guide (docs/src/guides/kubectl-plugin.md) installs it.
fn plugin_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("crd-lifecycle-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let plugin = dir.join("kubectl-crd_lifecycle");
    let _ = std::fs::remove_file(&plugin);
    std::fs::copy(env!("CARGO_BIN_EXE_crd-lifecycle"), &plugin).expect("installed");
    dir
}

/// Runs kubectl with the plugin directory first on the PATH and no cluster configured.
fn kubectl(dir: &Path, args: &[&str]) -> Output {
    let path = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    Command::new("kubectl")
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("kubectl runs")
}

#[test]
fn kubectl_finds_and_runs_the_plugin() {
    if Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_err()
    {
        eprintln!("skipped: no kubectl on the PATH (CI has one: scripts/check-deploy.sh needs it)");
        return;
    }
    let dir = plugin_dir();

    let listed = kubectl(&dir, &["plugin", "list"]);
    let stdout = text(&listed.stdout);
    assert!(
        stdout.contains(&dir.join("kubectl-crd_lifecycle").display().to_string()),
        "{stdout}{}",
        text(&listed.stderr)
    );
    assert!(
        !text(&listed.stderr).contains("kubectl-crd_lifecycle"),
        "no warning about it: {}",
        text(&listed.stderr)
    );

    let help = kubectl(&dir, &["crd-lifecycle", "--help"]);
    assert!(help.status.success(), "{}", text(&help.stderr));
    let help = text(&help.stdout);
    assert!(
        help.contains("Usage: kubectl crd-lifecycle [OPTIONS] <COMMAND>"),
        "{help}"
    );
    for command in ["plan", "migrate", "convert"] {
        assert!(help.contains(&format!("  {command} ")), "{command} in {help}");
    }

    // The subcommands work through kubectl, arguments and exit codes passed through.
    let plan = kubectl(
        &dir,
        &[
            "crd-lifecycle",
            "plan",
            "--policy",
            "examples/widgets/policy.yaml",
            "--crd",
            "examples/widgets/crd.yaml",
            "--at",
            "2026-07-01T00:00:00Z",
        ],
    );
    assert!(plan.status.success(), "{}", text(&plan.stderr));
    assert!(
        text(&plan.stdout).contains("kind: CustomResourceDefinition"),
        "{}",
        text(&plan.stdout)
    );
    let convert = kubectl(&dir, &["crd-lifecycle", "convert", "--help"]);
    assert!(convert.status.success());
    assert!(text(&convert.stdout).contains("Usage: kubectl crd-lifecycle convert"));
    for command in ["audit", "adopt", "test"] {
        let help = kubectl(&dir, &["crd-lifecycle", command, "--help"]);
        assert!(help.status.success(), "{command}");
        assert!(
            text(&help.stdout).contains(&format!("Usage: kubectl crd-lifecycle {command}")),
            "{}",
            text(&help.stdout)
        );
    }
    let bad = kubectl(&dir, &["crd-lifecycle", "migrate"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert!(
        text(&bad.stderr).contains("Usage: kubectl crd-lifecycle migrate"),
        "{}",
        text(&bad.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
