//! Schema-aware conversion: coverage of every field that differs between adjacent versions
//! (plan exit 2 naming the versions and paths), accepted losses, and `crd-lifecycle test`
//! (generated objects, shrunk failures, golden corpora).

use std::io::Write;
use std::process::{Command, Output, Stdio};

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
    input.write_all(stdin.unwrap_or("").as_bytes()).expect("stdin");
    drop(input);
    child.wait_with_output().expect("the binary finishes")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The issue's CRD: v1beta1 has spec.size, spec.legacy (boolean) and spec.port (string); v1
/// has spec.replicas and an integer spec.port, and no spec.legacy.
const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: things.example.com}
spec:
  group: example.com
  names: {kind: Thing, plural: things}
  scope: Namespaced
  versions:
  - name: v1beta1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
              legacy: {type: boolean}
              port: {type: string, pattern: '^[0-9]{1,4}$'}
  - name: v1
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              replicas: {type: integer}
              port: {type: integer, minimum: 0, maximum: 9999}
"#;

fn policy(step_extra: &str) -> String {
    format!(
        r#"
apiVersion: crdlifecycle.io/v1alpha1
kind: VersionPolicy
metadata: {{name: things}}
spec:
  crdName: things.example.com
  versions:
  - name: v1beta1
  - name: v1
  conversion:
    changes:
    - from: v1beta1
      to: v1
      renamed: [{{from: spec.size, to: spec.replicas}}]
{step_extra}
"#
    )
}

const COMPLETE: &str = r#"      changed: [{path: spec.port, upgrade: "int(self)", downgrade: "string(self)"}]
      acceptLoss: [{path: spec.legacy, reason: "never read by the controller"}]"#;

fn files(policy_text: &str) -> (tempdir::Dir, String, String) {
    let dir = tempdir::Dir::new();
    let policy_path = dir.write("policy.yaml", policy_text);
    let crd_path = dir.write("crd.yaml", CRD);
    (dir, policy_path, crd_path)
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "crd-lifecycle-schema-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(&path).expect("temp dir");
            Dir(path)
        }
        pub fn write(&self, name: &str, text: &str) -> String {
            let path = self.0.join(name);
            std::fs::write(&path, text).expect("write");
            path.display().to_string()
        }
        pub fn path(&self, name: &str) -> String {
            self.0.join(name).display().to_string()
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn plan_refuses_a_conversion_that_leaves_fields_uncovered() {
    let (_dir, policy_path, crd_path) = files(&policy(""));
    for command in ["plan", "test"] {
        let output = run(&[command, "--policy", &policy_path, "--crd", &crd_path], None);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{command}: {}",
            text(&output.stdout)
        );
        let stderr = text(&output.stderr);
        for expected in [
            "spec.conversion.changes[0]: v1beta1 -> v1: spec.legacy (boolean) of v1beta1 has no place in v1",
            "spec.conversion.changes[0]: v1beta1 -> v1: spec.port is string in v1beta1 and integer in v1: add a changed rule for spec.port",
        ] {
            assert!(stderr.contains(expected), "{command}: {expected:?} in {stderr}");
        }
    }
}

#[test]
fn a_covered_conversion_plans_and_shows_the_accepted_loss() {
    let (_dir, policy_path, crd_path) = files(&policy(COMPLETE));
    let output = run(
        &[
            "plan",
            "--policy",
            &policy_path,
            "--crd",
            &crd_path,
            "-o",
            "markdown",
        ],
        None,
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let page = text(&output.stdout);
    assert!(
        page.contains("- dropped on purpose `spec.legacy`: never read by the controller"),
        "{page}"
    );
    let output = run(
        &[
            "plan",
            "--policy",
            &policy_path,
            "--crd",
            &crd_path,
            "-o",
            "table",
        ],
        None,
    );
    assert!(
        text(&output.stdout)
            .contains("v1beta1 -> v1 drops spec.legacy on purpose: never read by the controller"),
        "{}",
        text(&output.stdout)
    );
}

#[test]
fn test_passes_for_the_bundled_example_and_a_covered_policy() {
    let output = run(
        &[
            "test",
            "--policy",
            "examples/conversion/policy.yaml",
            "--crd",
            "examples/conversion/crd.yaml",
            "--objects",
            "examples/conversion",
            "--cases",
            "60",
        ],
        None,
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    assert!(text(&output.stdout).starts_with("ok: 183 objects (60 generated per version, seed 1)"));
    // The same seed, the same objects: a failure can be reproduced.
    let (_dir, policy_path, crd_path) = files(&policy(COMPLETE));
    let output = run(
        &[
            "test",
            "--policy",
            &policy_path,
            "--crd",
            &crd_path,
            "--seed",
            "7",
        ],
        None,
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stdout));
}

#[test]
fn test_prints_the_smallest_failing_object_and_its_conversion() {
    // The downgrade divides by the port: port 0 cannot convert down.
    let lossy = COMPLETE.replace(
        "downgrade: \"string(self)\"",
        "downgrade: \"self == 0 ? string(1 / self) : string(self)\"",
    );
    let (_dir, policy_path, crd_path) = files(&policy(&lossy));
    let output = run(&["test", "--policy", &policy_path, "--crd", &crd_path], None);
    assert_eq!(output.status.code(), Some(1));
    let stdout = text(&output.stdout);
    assert!(stdout.starts_with("FAIL v1 -> v1beta1"), "{stdout}");
    assert!(stdout.contains("field: spec.port"), "{stdout}");
    // Shrunk: only the field that fails is left, with a value as small as still fails.
    let object = stdout
        .split("smallest failing object (v1):\n")
        .nth(1)
        .expect("the object");
    assert!(object.contains("spec:\n  port: 0\n"), "{object}");
    assert!(!object.contains("replicas"), "{object}");
}

#[test]
fn a_golden_corpus_catches_a_conversion_that_changed() {
    let (dir, policy_path, crd_path) = files(&policy(COMPLETE));
    let corpus = dir.path("golden");
    let record = run(
        &[
            "test",
            "--policy",
            &policy_path,
            "--crd",
            &crd_path,
            "--cases",
            "20",
            "--record",
            &corpus,
        ],
        None,
    );
    assert_eq!(record.status.code(), Some(0), "{}", text(&record.stderr));
    assert!(std::path::Path::new(&corpus).join("v1beta1.json").exists());
    let same = run(
        &[
            "test",
            "--policy",
            &policy_path,
            "--crd",
            &crd_path,
            "--golden",
            &corpus,
        ],
        None,
    );
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stdout));
    // Renaming the field's target changes what v1 objects look like.
    let changed = policy(COMPLETE).replace("to: spec.replicas", "to: spec.count");
    let crd = CRD.replace("replicas: {type: integer}", "count: {type: integer}");
    let policy_path = dir.write("changed.yaml", &changed);
    let crd_path = dir.write("changed-crd.yaml", &crd);
    let different = run(
        &[
            "test",
            "--policy",
            &policy_path,
            "--crd",
            &crd_path,
            "--golden",
            &corpus,
        ],
        None,
    );
    assert_eq!(different.status.code(), Some(1), "{}", text(&different.stdout));
    let stdout = text(&different.stdout);
    // v1 inputs recorded with spec.replicas no longer fit v1; v1beta1 inputs now convert to
    // spec.count: either way the corpus says what changed.
    assert!(
        stdout.contains("(golden ") && stdout.contains("spec.replicas"),
        "{stdout}"
    );
}

#[test]
fn webhook_and_convert_check_the_crd_they_are_given() {
    let (dir, policy_path, crd_path) = files(&policy(""));
    let output = run(
        &[
            "webhook",
            "--policy",
            &policy_path,
            "--crd",
            &crd_path,
            "--port",
            "0",
        ],
        None,
    );
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("v1beta1 -> v1: spec.legacy (boolean) of v1beta1 has no place in v1"),
        "{}",
        text(&output.stderr)
    );
    // A converted object that the target version's schema would reject.
    let policy_path = dir.write("complete.yaml", &policy(COMPLETE));
    let object = dir.write(
        "thing.yaml",
        "apiVersion: example.com/v1beta1\nkind: Thing\nmetadata: {name: t, namespace: d}\nspec: {size: 1, port: \"0100\"}\n",
    );
    let fits = run(
        &[
            "convert",
            "--policy",
            &policy_path,
            "--crd",
            &crd_path,
            "--to",
            "v1",
            &object,
        ],
        None,
    );
    assert_eq!(fits.status.code(), Some(0), "{}", text(&fits.stderr));
    assert!(text(&fits.stdout).contains("port: 100"), "{}", text(&fits.stdout));
    let wide = dir.write(
        "wide.yaml",
        "apiVersion: example.com/v1\nkind: Thing\nmetadata: {name: w, namespace: d}\nspec: {port: 99999}\n",
    );
    let crd_path = dir.write("wide-crd.yaml", &CRD.replace("maximum: 9999", "maximum: 99999"));
    let rejected = run(
        &[
            "convert",
            "--policy",
            &policy_path,
            "--crd",
            &crd_path,
            "--to",
            "v1beta1",
            &wide,
        ],
        None,
    );
    assert_eq!(rejected.status.code(), Some(2));
    assert!(
        text(&rejected.stderr).contains(
            "the converted object does not fit v1beta1's schema: spec.port: Invalid value: \"99999\": should match '^[0-9]{1,4}$'"
        ),
        "{}",
        text(&rejected.stderr)
    );
}

/// The issue's example (finding 8): v2 adds `appProtocol` to the items of `spec.ports`, a
/// list keyed by `port`.
const PORTS_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: services.example.com}
spec:
  group: example.com
  names: {kind: Service, plural: services}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              ports:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [port]
                items:
                  type: object
                  required: [port]
                  properties:
                    port: {type: integer, minimum: 1, maximum: 65535}
  - name: v2
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              ports:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [port]
                items:
                  type: object
                  required: [port]
                  properties:
                    port: {type: integer, minimum: 1, maximum: 65535}
                    appProtocol: {type: string, enum: [http, https, tcp]}
"#;

fn ports_policy(step: &str) -> String {
    format!(
        r#"
apiVersion: crdlifecycle.io/v1alpha1
kind: VersionPolicy
metadata: {{name: services}}
spec:
  crdName: services.example.com
  versions:
  - name: v1
  - name: v2
  conversion:
    changes:
    - from: v1
      to: v2
{step}
"#
    )
}

fn ports_files(step: &str) -> (tempdir::Dir, String, String) {
    let dir = tempdir::Dir::new();
    let policy_path = dir.write("policy.yaml", &ports_policy(step));
    let crd_path = dir.write("crd.yaml", PORTS_CRD);
    (dir, policy_path, crd_path)
}

/// Coverage looks into list items: a field v2's items add needs a rule, a rule on a keyed
/// list's items must match them by its keys, and a type change whose downgrade keeps what
/// v1's items have no place for (the apiserver would prune it on every write through v2
/// while v1 stores) is a loss the policy does not declare. `plan` and `test` refuse all three.
#[test]
fn coverage_catches_what_converting_down_would_lose_inside_list_items() {
    let cases = [
        (
            "",
            "v1 -> v2: spec.ports[].appProtocol (string) of v2 has no place in v1: converting down would lose it",
        ),
        (
            "      added: [{path: \"spec.ports[].appProtocol\", default: tcp}]",
            "v1 -> v2: spec.ports[].appProtocol: the items of spec.ports are matched by port (x-kubernetes-list-map-keys): write spec.ports[port]",
        ),
        (
            "      changed: [{path: spec.ports, upgrade: self, downgrade: self}]",
            "v1 -> v2: spec.ports: downgrade `self` gives ",
        ),
    ];
    for (step, expected) in cases {
        let (_dir, policy_path, crd_path) = ports_files(step);
        for command in ["plan", "test"] {
            let output = run(&[command, "--policy", &policy_path, "--crd", &crd_path], None);
            let stderr = text(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{command} {step:?}: {stderr}");
            assert!(
                stderr.contains(expected),
                "{command} {step:?}: {expected:?} in {stderr}"
            );
        }
    }
    // The lossy one names the field and what to do.
    let (_dir, policy_path, crd_path) = ports_files(cases[2].0);
    let stderr = text(&run(&["plan", "--policy", &policy_path, "--crd", &crd_path], None).stderr);
    assert!(
        stderr.contains("and v1 has no place for spec.ports[")
            && stderr.contains("].appProtocol: the apiserver would prune it"),
        "{stderr}"
    );
}

/// Declared per item (by key), or with a downgrade that drops what v1 cannot hold (kept in
/// the annotation), or with the loss accepted: coverage holds, and `test` converts generated
/// objects down and back exactly.
#[test]
fn a_covered_list_item_change_round_trips_in_test() {
    for step in [
        "      added: [{path: \"spec.ports[port].appProtocol\", default: tcp}]",
        "      changed: [{path: spec.ports, upgrade: self, downgrade: \"self.map(p, {'port': p.port})\"}]",
        "      changed: [{path: spec.ports, upgrade: self, downgrade: self}]\n      acceptLoss: [{path: \"spec.ports[port].appProtocol\", reason: \"v1 clients never send it\"}]",
    ] {
        let (_dir, policy_path, crd_path) = ports_files(step);
        let output = run(
            &[
                "test",
                "--policy",
                &policy_path,
                "--crd",
                &crd_path,
                "--cases",
                "60",
            ],
            None,
        );
        assert_eq!(
            output.status.code(),
            Some(0),
            "{step}: {}{}",
            text(&output.stdout),
            text(&output.stderr)
        );
    }
}
