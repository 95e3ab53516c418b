#!/bin/bash
# dlcp testbed run in turns: a base commit (a worktree built beside the checkout; its
# ranks run its code through PYTHONPATH) and the checkout, PAIRS pairs of SCENARIO at
# LINK_RATE Mbit/s; one summary line a run in OUT. Root, from the repository's root.
#   BASE=<commit> PAIRS=3 SCENARIO=clean OUT=testbed.txt docs/results/2026-12-01/posted_receives/ab_testbed.sh
set -eu
here=$(pwd)
base=$(mktemp -d)/base
git worktree add -q "$base" "${BASE:?a base commit}"
trap 'git worktree remove --force "$base"' EXIT
(cd "$base" && "$here/.venv/bin/python" setup.py build_ext --inplace -q > /dev/null)
out=${OUT:-testbed.txt}
scenario=${SCENARIO:-clean}
rate=${LINK_RATE:-200}
results=$(mktemp -d)
for pair in $(seq "${PAIRS:-3}"); do
  for tree in base new; do
    if [ "$tree" = base ]; then path=$base; else path=$here; fi
    line=$(PYTHONPATH=$path .venv/bin/dlcp testbed run --scenario "$scenario" --transport dlcp \
      --epochs 3 --hidden 1024 --link-rate "$rate" --results "$results/$tree$pair" 2>&1 |
      grep -E "accuracy|ranks .* CPU s" | sed 's/router drops.*//' | tr '\n' ' ')
    echo "$scenario-$rate-$tree-$pair | $line" | tee -a "$out"
  done
done
