#!/usr/bin/env bash
# The release binary, with its dependency list embedded (cargo-auditable), so that scanners
# (`cargo audit bin`, Trivy, Grype, Syft) can read which crates and versions it contains.
# The Dockerfile builds the same way. Installs cargo-auditable (pinned) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_AUDITABLE_VERSION=0.7.7
if [ "$(cargo auditable --version 2>/dev/null | awk '{print $2}')" != "$CARGO_AUDITABLE_VERSION" ]; then
  cargo install --locked --quiet "cargo-auditable@$CARGO_AUDITABLE_VERSION"
fi
cargo auditable build --release --locked --bin crd-lifecycle "$@"
binary="target/release/crd-lifecycle"
for dir in target/*/release; do
  [ -x "$dir/crd-lifecycle" ] && binary="$dir/crd-lifecycle"
done
# The dependency list lives in the .dep-v0 section (zlib-compressed JSON).
if ! readelf -S "$binary" 2>/dev/null | grep -q '\.dep-v0'; then
  echo "error: $binary has no .dep-v0 section: the dependency list was not embedded" >&2
  exit 1
fi
echo "$binary: dependency list embedded (.dep-v0)"
