#!/usr/bin/env bash
# The lifecycle pages of the bundled examples (`plan -o markdown`): each checked-in
# examples/*/LIFECYCLE.md must be what plan renders (the output is stable), and every page
# must pass the Markdown lint (pymarkdownlnt, pinned; .ci/run installs it).
#   scripts/check-docs.sh            check
#   scripts/check-docs.sh --update   write the pages anew
set -euo pipefail
cd "$(dirname "$0")/.."
update=false
[ "${1:-}" = "--update" ] && update=true
cargo build --locked --quiet --bin crd-lifecycle
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
for example in examples/*/; do
  [ -f "$example/policy.yaml" ] && [ -f "$example/crd.yaml" ] || continue
  page="$example/LIFECYCLE.md"
  rendered="$work/$(basename "$example").md"
  target/debug/crd-lifecycle plan --policy "$example/policy.yaml" --crd "$example/crd.yaml" -o markdown > "$rendered"
  if $update; then
    cp "$rendered" "$page"
  elif ! diff -u "$page" "$rendered"; then
    echo "$page is out of date: run scripts/check-docs.sh --update" >&2
    status=1
  fi
done
python3 -m pymarkdown scan "$work"/*.md
echo "lifecycle pages: up to date and lint-clean"
exit $status
