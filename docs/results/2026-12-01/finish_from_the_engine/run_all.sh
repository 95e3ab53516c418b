#!/bin/bash
# A/B in turns, one run at a time: a worktree of 88c7197 built in /tmp/basewt (base) against
# the checkout at 3a51f11 (new); outputs in /tmp/ab (copied here: turns.jsonl, ring_25mb.jsonl;
# the testbed runs' results summed up in testbed_all.txt). Root (the testbed), from the checkout's root.
set -u
cd /work/main
export PATH=/work/main/.venv/bin:$PATH
for i in 1 2 3; do
  for t in base new; do
    tree=$([ $t = base ] && echo /tmp/basewt || echo /work/main)
    line=$(cd $tree && timeout 900 python -m dlcp.bench.turns --json 2>/dev/null | tail -1)
    echo "{\"tree\": \"$t\", \"run\": $line}" >> /tmp/ab/turns.jsonl
  done
done
echo turns done $(date)
TREES="base=/tmp/basewt new=/work/main" SCENARIO=clean RATE=200 PAIRS=3 OUT=/tmp/ab/testbed_runs.txt RESULTS=/tmp/ab/tb \
  bash docs/results/2026-12-01/steady_rate_windows/ab_trees.sh
TREES="base=/tmp/basewt new=/work/main" SCENARIO=loss RATE=50 PAIRS=2 OUT=/tmp/ab/testbed_runs.txt RESULTS=/tmp/ab/tb \
  bash docs/results/2026-12-01/steady_rate_windows/ab_trees.sh
git checkout -q results/testbed.csv 2>/dev/null
echo testbed done $(date)
for i in 1 2 3; do
  for t in base new; do
    tree=$([ $t = base ] && echo /tmp/basewt || echo /work/main)
    line=$(cd $tree && timeout 900 python -m dlcp.bench.allreduce --loopback --json --elems 6250000 2>/dev/null | tail -1)
    echo "{\"tree\": \"$t\", \"run\": $line}" >> /tmp/ab/ring_25mb.jsonl
  done
done
echo ring done $(date)
