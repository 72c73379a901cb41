#!/usr/bin/env bash
# The generated documentation, up to date and lint-clean:
# - the lifecycle pages of the bundled examples (`plan -o markdown`): each checked-in
#   examples/*/LIFECYCLE.md must be what plan renders (the output is stable);
# - the book's generated pages (docs/src/reference/{cli,versionpolicy,metrics,conditions,events}.md
#   and docs/src/internals/benchmarks-real.md): each must be what the hidden
#   `crd-lifecycle docgen` writes from the clap definitions, the CRD's schema, the metrics
#   registry, the condition and Event reasons and docs/bench/real.txt; and the manual pages
#   (docs/man/*.1, clap_mangen from the same clap definitions);
# - every page of the book, the README and the lifecycle pages pass the Markdown lint
#   (pymarkdownlnt, pinned; .ci/run installs it; settings in .pymarkdown.json).
#   scripts/check-docs.sh            check
#   scripts/check-docs.sh --update   write the generated pages anew
set -euo pipefail
cd "$(dirname "$0")/.."
update=false
[ "${1:-}" = "--update" ] && update=true
cargo build --locked --quiet --bin crd-lifecycle
binary="${CARGO_TARGET_DIR:-target}/debug/crd-lifecycle"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0

# A generated file against its checked-in copy (or written over it with --update).
compare() {
  local checked_in="$1" rendered="$2"
  if $update; then
    mkdir -p "$(dirname "$checked_in")"
    cp "$rendered" "$checked_in"
  elif ! diff -u "$checked_in" "$rendered"; then
    echo "$checked_in is out of date: run scripts/check-docs.sh --update" >&2
    status=1
  fi
}

mkdir -p "$work/examples"
for example in examples/*/; do
  [ -f "$example/policy.yaml" ] && [ -f "$example/crd.yaml" ] || continue
  rendered="$work/examples/$(basename "$example").md"
  "$binary" plan --policy "$example/policy.yaml" --crd "$example/crd.yaml" -o markdown > "$rendered"
  compare "$example/LIFECYCLE.md" "$rendered"
done

"$binary" docgen --out "$work/book" --man "$work/man" --bench-results docs/bench/real.txt > "$work/generated"
while read -r page; do
  case "$page" in
    "$work/man/"*) compare "docs/man/${page#"$work/man/"}" "$page" ;;
    *) compare "docs/src/${page#"$work/book/"}" "$page" ;;
  esac
done < "$work/generated"

# SUMMARY.md is mdBook's table of contents (its part titles are headings of their own), not a
# page: `mdbook build docs` in .ci/run checks it.
python3 -m pymarkdown --config .pymarkdown.json scan "$work"/examples/*.md README.md
find docs/src -name '*.md' ! -name SUMMARY.md -print0 | xargs -0 python3 -m pymarkdown --config .pymarkdown.json scan
echo "generated pages: up to date and lint-clean"
exit $status
