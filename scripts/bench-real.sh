#!/usr/bin/env bash
# Benchmarks on a real control plane (issue 30): `migrate` against a raw client, the conversion
# webhook against a minimal one through the apiserver, and a fleet of policies due at the same
# second. Starts etcd, kube-apiserver and kube-controller-manager from KUBEBUILDER_ASSETS on
# loopback (the e2e suite's harness) and prints each figure beside its target, with the date,
# the server version and this machine. Never run by CI: benchmarks gate nothing.
#   scripts/bench-real.sh                    every section (about 40 minutes on 2 cores)
#   scripts/bench-real.sh fleet webhook      some
#   scripts/bench-real.sh --save [SECTION]   also keep the output in docs/bench/real.txt (only
#                                            when the run completes) and render the book's page
#                                            of it, docs/src/internals/benchmarks-real.md
# Sizes: BENCH_MIGRATE_SIZES (5000,50000), BENCH_MIGRATE_ROUNDS (2), BENCH_WEBHOOK_OBJECTS
# (5000), BENCH_WEBHOOK_ROUNDS (3), BENCH_POLICIES (1000), BENCH_FLEET_LEAD_SECS.
set -euo pipefail
cd "$(dirname "$0")/.."
save=false
if [ "${1:-}" = "--save" ]; then
  save=true
  shift
fi
assets="${KUBEBUILDER_ASSETS:-/usr/local/kubebuilder/bin}"
for binary in etcd kube-apiserver; do
  if [ ! -x "$assets/$binary" ]; then
    echo "bench-real: no $binary in $assets: set KUBEBUILDER_ASSETS (docs/src/internals/e2e.md)" >&2
    exit 2
  fi
done
run() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "machine: nproc $(nproc), $(awk '/^MemTotal:/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) memory, $(uname -sr)"
  echo "server: $("$assets/kube-apiserver" --version)"
  # Sizes other than the defaults, so that a saved run says what it measured.
  env | grep '^BENCH_' | sort | sed 's/^/setting: /' || true
  KUBEBUILDER_ASSETS="$assets" cargo bench --locked --bench real -- "$@"
}
if ! $save; then
  run "$@"
  exit
fi
output="$(mktemp)"
trap 'rm -f "$output"' EXIT
run "$@" | tee "$output"
mkdir -p docs/bench
cp "$output" docs/bench/real.txt
echo "bench-real: saved docs/bench/real.txt; rendering its page"
scripts/check-docs.sh --update
