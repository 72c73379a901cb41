#!/usr/bin/env bash
# Proof of the simulation's power: every known bug, kept as a mutant (a patch under
# tests/mutants/ that puts it back), must make the simulation (tests/simulation) fail within
# the seed budget, with no scenario written for it. Each patch is applied, the simulation
# runs, and the patch is reverted (also on failure or interrupt).
#
#   scripts/mutants.sh                 every mutant, SIM_SEEDS (default 500) seeds each
#   scripts/mutants.sh NAME...         only these (file names without .patch)
#
# Prints per mutant the seed that caught it and after how many seeds, then one line:
# `mutants: N caught, M missed` (exit 1 when any was missed).
set -euo pipefail
cd "$(dirname "$0")/.."
budget="${SIM_SEEDS:-500}"
patches=()
if [ "$#" -gt 0 ]; then
  for name in "$@"; do patches+=("tests/mutants/$name.patch"); done
else
  patches=(tests/mutants/*.patch)
fi
for patch in "${patches[@]}"; do
  if ! git apply --check "$patch" 2>/dev/null; then
    echo "mutants: $patch does not apply to this tree (commit or stash changes to the files it touches)" >&2
    exit 2
  fi
done
applied=""
revert() {
  if [ -n "$applied" ]; then
    git apply -R "$applied"
    applied=""
  fi
}
trap revert EXIT INT TERM
caught=0
missed=0
for patch in "${patches[@]}"; do
  name="$(basename "$patch" .patch)"
  git apply "$patch"
  applied="$patch"
  log="$(mktemp)"
  started=$(date +%s)
  if SIM_SEEDS="$budget" SIM_NO_SHRINK=1 cargo test --locked --quiet --test simulation >"$log" 2>&1; then
    echo "mutant $name: MISSED in $budget seeds"
    missed=$((missed + 1))
  elif line="$(grep -m1 'first violation at seed' "$log")"; then
    what="$(grep -m1 'VIOLATED' "$log" | sed 's/.*VIOLATION //' | cut -c1-160)"
    echo "mutant $name: caught, ${line#simulation: first violation }, in $(( $(date +%s) - started ))s: $what"
    caught=$((caught + 1))
  else
    echo "mutant $name: the simulation did not run:"
    tail -20 "$log"
    missed=$((missed + 1))
  fi
  rm -f "$log"
  revert
done
# Equivalent mutants (tests/mutants/equivalent/README.md says why each cannot change what a run
# does to stored objects) are not run; each must still apply, so that a change around it is seen.
for patch in tests/mutants/equivalent/*.patch; do
  [ -e "$patch" ] || continue
  name="$(basename "$patch" .patch)"
  if git apply --check "$patch" 2>/dev/null; then
    echo "mutant $name: equivalent, not run (tests/mutants/equivalent/README.md)"
  else
    echo "mutant $name: equivalent, but no longer applies: check its argument against the code and refresh it"
    missed=$((missed + 1))
  fi
done
echo "mutants: $caught caught, $missed missed"
[ "$missed" = 0 ]
