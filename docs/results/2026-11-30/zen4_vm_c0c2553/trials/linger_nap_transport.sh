#!/bin/bash
# usage: linger_nap_transport.sh OUTDIR ROUNDS NAP_NS...: dlcp.bench.transport with each nap in turns (a build with linger_nap.diff applied)
out=$1; rounds=$2; shift 2
for r in $(seq 1 $rounds); do for nap in "$@"; do
  TRIAL_LINGER_NAP_NS=$nap python -m dlcp.bench.transport --json --no-progress 2>/dev/null | tail -1 > "$out/tp_${nap}_$r.json"
done; done
