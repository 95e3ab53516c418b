#!/bin/bash
# incast and loss, default model: Gloo with the hosts' TCP minimum RTO left at the
# kernel's 200 ms (DLCP_CONTROL_RTO_MIN=0), Gloo with DLCP's 5 ms, and DLCP, in turns
# (three rounds, the order reversed in the second)
cd /work/wt-audit
B=".venv/bin/dlcp testbed run --epochs 3 --results /tmp/audit-tb/results-rto"
one() { echo "== $(date -u +%T) $* (load $(cut -d' ' -f1-3 /proc/loadavg))"; env $1 $B "${@:2}" 2>&1 | tail -1; }
for sc in incast loss; do
  for round in 1 2 3; do
    if [ $round = 2 ]; then
      one X=1 --scenario $sc --transport dlcp; one X=1 --scenario $sc --transport gloo
      one DLCP_CONTROL_RTO_MIN=0 --scenario $sc --transport gloo
    else
      one DLCP_CONTROL_RTO_MIN=0 --scenario $sc --transport gloo
      one X=1 --scenario $sc --transport gloo; one X=1 --scenario $sc --transport dlcp
    fi
  done
done
echo "== $(date -u +%T) done"
