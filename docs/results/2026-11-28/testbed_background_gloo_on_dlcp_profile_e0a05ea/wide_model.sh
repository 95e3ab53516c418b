#!/bin/bash
cd /work/wt-audit
B=".venv/bin/dlcp testbed run --scenario background --epochs 2 --hidden 1024 --results /tmp/audit-tb/results-wide"
one() { echo "== $(date -u +%T) $* (load $(cut -d' ' -f1-3 /proc/loadavg))"; $B "$@" 2>&1 | tail -2; }
one --transport gloo --profile fifo; one --transport gloo --profile dlcp; one --transport dlcp
one --transport dlcp; one --transport gloo --profile dlcp; one --transport gloo --profile fifo
echo "== $(date -u +%T) done"
