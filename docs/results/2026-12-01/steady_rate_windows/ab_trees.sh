#!/bin/bash
# dlcp testbed run in turns over several checkouts, each built in place (python setup.py
# build_ext --inplace) and run through PYTHONPATH: PAIRS rounds of SCENARIO at RATE
# Mbit/s, one summary line a run in OUT, each run's results under RESULTS. Root, from
# this repository's root (its .venv runs every tree).
#   TREES="base=/tmp/basewt steady=$PWD" SCENARIO=clean RATE=200 PAIRS=2 OUT=runs.txt \
#     docs/results/2026-12-01/steady_rate_windows/ab_trees.sh
set -eu
results=${RESULTS:-$(mktemp -d)}
scenario=${SCENARIO:-clean}
rate=${RATE:-200}
for pair in $(seq "${PAIRS:-2}"); do
  for t in ${TREES:?name=path ...}; do
    name=${t%%=*}
    run="$name-$scenario-$rate-$pair"
    line=$(PYTHONPATH=${t#*=} .venv/bin/dlcp testbed run --scenario "$scenario" --transport dlcp \
      --epochs 3 --hidden 1024 --link-rate "$rate" --results "$results/$run" 2>&1 |
      grep -E "accuracy|ranks .* CPU s" | sed 's/router drops.*//' | tr '\n' ' ')
    echo "$run | $line" | tee -a "${OUT:-runs.txt}"
  done
done
