#!/usr/bin/env bash
# Runs the end-to-end suite against the operator deployed in a kind cluster.
#
# Requires: docker (a running engine), kind, kubectl, cargo.
# Usage:    tests/e2e/kind.sh            (KEEP_CLUSTER=1 keeps the cluster afterwards)
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in docker kind kubectl cargo; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "kind.sh: '$tool' is required but not installed" >&2
    exit 1
  fi
done
if ! docker info >/dev/null 2>&1; then
  echo "kind.sh: docker is installed but no engine is reachable" >&2
  exit 1
fi

cluster="crd-lifecycle-e2e-$$"
image="crd-lifecycle:e2e"
kubeconfig="$(mktemp)"
cleanup() {
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then
    kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
  fi
  rm -f "$kubeconfig"
}
trap cleanup EXIT

echo "== creating kind cluster $cluster"
kind create cluster --name "$cluster" --kubeconfig "$kubeconfig" --wait 120s
export KUBECONFIG="$kubeconfig"

echo "== building $image"
docker build -t "$image" .
kind load docker-image "$image" --name "$cluster"

echo "== deploying crds/ and deploy/"
workdir="$(mktemp -d)"
cp -r deploy crds "$workdir/"
(cd "$workdir/deploy" && kubectl kustomize . \
  | sed "s#ghcr.io/crd-lifecycle/crd-lifecycle:0.1.0#$image#" \
  | sed 's#imagePullPolicy: Always#imagePullPolicy: IfNotPresent#' > "$workdir/all.yaml")
kubectl apply -f "$workdir/all.yaml"
kubectl -n crd-lifecycle rollout status deployment/crd-lifecycle --timeout=180s

echo "== running the suite in in-cluster mode"
E2E_IN_CLUSTER=1 cargo test --locked --test e2e
