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

for variant in "${variants[@]}"; do
  rendered="$work/$(echo "$variant" | tr / _).yaml"
  kubectl kustomize "$variant" > "$rendered"
  for version in "${schemas[@]}"; do
    # Unknown kinds (ServiceMonitor, PrometheusRule) are a warning, not an error.
    if ! output="$(python3 -m kubernetes_validate --strict --quiet -k "$version" "$rendered" 2>&1)"; then
      echo "$output" >&2
      echo "$variant does not validate against Kubernetes $version" >&2
      exit 1
    fi
  done
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
