#!/usr/bin/env bash
# Checks every install variant offline, as CI does:
#   - renders it with `kubectl kustomize`;
#   - validates each built-in object against the Kubernetes schemas (kubernetes-validate,
#     --strict, oldest and newest schema it ships); the Prometheus Operator's kinds have no
#     schema there, so their content is checked by promtool below;
#   - checks that no Role or ClusterRole has a wildcard;
#   - checks the alert rules and runs their unit tests (`promtool test rules`);
#   - checks that the dashboard is JSON and labelled for the Grafana sidecar.
# Needs kubectl, kubernetes-validate (PyPI) and promtool (Debian package prometheus); .ci/run
# installs the last two.
set -euo pipefail
cd "$(dirname "$0")/.."

variants=(deploy variants/monitoring variants/ha variants/ha-monitoring)
schemas=(1.25.0 1.37.0)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Validates a rendered file against every schema version. Unknown kinds (ServiceMonitor,
# PrometheusRule, Flux's Kustomization) are a warning, not an error.
validate() {
  local rendered="$1" name="$2" version output
  for version in "${schemas[@]}"; do
    if ! output="$(python3 -m kubernetes_validate --strict --quiet -k "$version" "$rendered" 2>&1)"; then
      echo "$output" >&2
      echo "$name does not validate against Kubernetes $version" >&2
      exit 1
    fi
  done
}

for variant in "${variants[@]}"; do
  rendered="$work/$(echo "$variant" | tr / _).yaml"
  kubectl kustomize "$variant" > "$rendered"
  validate "$rendered" "$variant"
  # Least privilege: no wildcard in any rule of any Role or ClusterRole.
  python3 - "$rendered" <<'EOF'
import sys, yaml
bad = []
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if not doc or doc["kind"] not in ("Role", "ClusterRole"):
        continue
    for rule in doc.get("rules") or []:
        for field in ("apiGroups", "resources", "verbs", "nonResourceURLs"):
            if any("*" in value for value in rule.get(field) or []):
                bad.append(f'{doc["kind"]} {doc["metadata"]["name"]}: {field} {rule[field]}')
if bad:
    sys.exit("wildcard RBAC:\n  " + "\n  ".join(bad))
EOF
  kinds="$(grep -c '^kind:' "$rendered")"
  echo "$variant: $kinds objects render and validate (Kubernetes ${schemas[*]}); no wildcard RBAC"
done

# The upgrade examples (examples/upgrades/, docs/src/guides/upgrade-check.md): the Argo CD PreSync
# hook and the Flux check render with kustomize; the Helm chart's templates are rendered by
# the few template expressions they use (Helm is not installed here: .Release.Name,
# .Release.Namespace, .Files.Get and .Files.Glob(...).AsConfig | indent, and nothing else);
# the CI step's read-only role. Each validates like the install variants, with no wildcard
# RBAC; the Helm hook's ClusterRole grants exactly the base's (the one tests/e2e/check.rs runs
# `check --fix` as), and the Flux release dependsOn the check.
upgrades=examples/upgrades
kubectl kustomize "$upgrades/argocd" > "$work/upgrades-argocd.yaml"
kubectl kustomize "$upgrades/flux/check" > "$work/upgrades-flux-check.yaml"
cp "$upgrades/ci/readonly-rbac.yaml" "$work/upgrades-ci.yaml"
python3 - "$upgrades/helm" "$work/upgrades-helm.yaml" <<'PY'
import glob, os, re, sys, yaml
chart, out = sys.argv[1], sys.argv[2]
release = {"Name": "widgets", "Namespace": "widgets-system"}
def files_get(path):
    return open(os.path.join(chart, path)).read()
def as_config(pattern, indent):
    paths = sorted(glob.glob(os.path.join(chart, pattern)))
    assert paths, f"no file matches {pattern}"
    text = yaml.safe_dump({os.path.basename(p): open(p).read() for p in paths}, default_style="|", sort_keys=True)
    return "\n".join(" " * indent + line for line in text.rstrip("\n").split("\n"))
def render(text):
    text = re.sub(r"\{\{-?\s*/\*.*?\*/\s*-?\}\}\n?", "", text, flags=re.S)
    text = re.sub(r'\{\{\s*\(\.Files\.Glob "([^"]+)"\)\.AsConfig \| indent (\d+)\s*\}\}',
                  lambda m: as_config(m.group(1), int(m.group(2))), text)
    text = re.sub(r'\{\{\s*\.Files\.Get "([^"]+)"\s*\}\}', lambda m: files_get(m.group(1)), text)
    text = re.sub(r"\{\{\s*\.Release\.(Name|Namespace)\s*\}\}", lambda m: release[m.group(1)], text)
    left = re.findall(r"\{\{.*?\}\}", text)
    assert not left, f"template expressions this check does not render: {left}"
    return text
docs = [render(open(p).read()) for p in sorted(glob.glob(os.path.join(chart, "templates", "*.yaml")))]
rendered = "\n---\n".join(docs)
list(yaml.safe_load_all(rendered))
open(out, "w").write(rendered)
PY
for rendered in "$work"/upgrades-*.yaml; do
  validate "$rendered" "$(basename "$rendered")"
done
python3 - "$work" "$upgrades" <<'PY'
import sys, yaml
work, upgrades = sys.argv[1], sys.argv[2]
def docs(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]
def rules(path):
    roles = [d for d in docs(path) if d["kind"] == "ClusterRole"]
    assert len(roles) == 1, f"{path}: {len(roles)} ClusterRoles"
    return roles[0]["rules"]
for name in ("argocd", "flux-check", "helm", "ci"):
    for doc in docs(f"{work}/upgrades-{name}.yaml"):
        for rule in doc.get("rules") or []:
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in v for v in rule.get(field) or []), f"{name}: wildcard in {doc['metadata']['name']}"
base = rules(f"{upgrades}/base/rbac.yaml")
assert rules(f"{work}/upgrades-helm.yaml") == base, "the Helm hook's ClusterRole differs from examples/upgrades/base/rbac.yaml"
helm = docs(f"{work}/upgrades-helm.yaml")
job = next(d for d in helm if d["kind"] == "Job")
assert "pre-upgrade" in job["metadata"]["annotations"]["helm.sh/hook"]
args = job["spec"]["template"]["spec"]["containers"][0]["args"]
assert args[:2] == ["check", "--fix"], args
# The operator the release replaces is named (its writes through the dropped version would
# fail every upgrade otherwise), as in the base Job Argo CD and Flux run.
assert args[args.index("--replaced-manager") + 1] == "widgets-operator", args
for name in ("argocd", "flux-check"):
    base_job = next(d for d in docs(f"{work}/upgrades-{name}.yaml") if d["kind"] == "Job")
    assert base_job["spec"]["template"]["spec"]["containers"][0]["args"] == args, (name, args)
crds = next(d for d in helm if d["kind"] == "ConfigMap")
assert set(crds["data"]) == {"widgets.yaml"}, crds["data"].keys()
assert yaml.safe_load(crds["data"]["widgets.yaml"])["kind"] == "CustomResourceDefinition"
argo = docs(f"{work}/upgrades-argocd.yaml")
assert all(d["metadata"]["annotations"]["argocd.argoproj.io/hook"] == "PreSync" for d in argo)
assert next(d for d in argo if d["kind"] == "Job")["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"] == "0"
flux = {d["metadata"]["name"]: d for d in docs(f"{upgrades}/flux/kustomizations.yaml")}
check = flux["widgets-upgrade-check"]["spec"]
assert check["wait"] and check["path"] == f"./{upgrades}/flux/check", check
assert {"name": "widgets-upgrade-check"} in flux["widgets"]["spec"]["dependsOn"]
ci = yaml.safe_load(open(f"{upgrades}/ci/pull-request.yaml"))
script = "\n".join(step.get("run", "") for step in ci["jobs"]["check"]["steps"])
assert "check -f rendered.yaml" in script and "-o markdown" in script, script
assert "--replaced-manager widgets-operator" in script, script
print("upgrade examples: Argo CD, Flux, Helm and CI render and validate; no wildcard RBAC; the Helm hook's role is the base's")
PY

# The alerts: the PrometheusRule's spec is a Prometheus rule file.
monitoring="deploy/components/monitoring"
python3 - "$monitoring/prometheusrule.yaml" "$work/crd-lifecycle.rules.yaml" <<'EOF'
import sys, yaml
rule = yaml.safe_load(open(sys.argv[1]))
assert rule["kind"] == "PrometheusRule", rule["kind"]
yaml.safe_dump(rule["spec"], open(sys.argv[2], "w"), sort_keys=False)
EOF
cp "$monitoring/alerts.test.yaml" "$work/"
promtool check rules "$work/crd-lifecycle.rules.yaml"
promtool test rules "$work/alerts.test.yaml"

# The dashboard: valid JSON, in a ConfigMap the kube-prometheus-stack sidecar picks up.
python3 - "$work/variants_monitoring.yaml" <<'EOF'
import json, sys, yaml
maps = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"]
dashboard = next(m for m in maps if m["metadata"]["name"] == "crd-lifecycle-dashboard")
assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
panels = json.loads(dashboard["data"]["crd-lifecycle.json"])["panels"]
print(f"dashboard: {len(panels)} panels, labelled grafana_dashboard=1")
EOF
echo "deploy: every variant renders and validates; alerts pass their tests"
