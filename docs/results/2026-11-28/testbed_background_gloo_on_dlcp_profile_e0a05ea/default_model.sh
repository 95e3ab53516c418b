#!/bin/bash
# background scenario: Gloo on its FIFO, Gloo on DLCP's switch profile, DLCP; three rounds,
# the order reversed in the second round
cd /work/wt-audit
B=".venv/bin/dlcp testbed run --scenario background --epochs 3 --results /tmp/audit-tb/results"
one() { echo "== $(date -u +%T) $*"; $B "$@" 2>&1 | tail -4; }
for round in 1 2 3; do
  if [ $round = 2 ]; then
    one --transport dlcp; one --transport gloo --profile dlcp; one --transport gloo --profile fifo
  else
    one --transport gloo --profile fifo; one --transport gloo --profile dlcp; one --transport dlcp
  fi
done
echo "== $(date -u +%T) done"
