#!/bin/bash
# usage: transport_ab.sh OUTDIR ROUNDS: dlcp.bench.transport with the receive linger off and on, in turns
out=$1; rounds=$2
for r in $(seq 1 $rounds); do for t in off on; do
  if [ $t = off ]; then export DLCP_RECEIVE_LINGER=0; else unset DLCP_RECEIVE_LINGER; fi
  python -m dlcp.bench.transport --json --no-progress 2>/dev/null | tail -1 > "$out/transport_${t}_$r.json"
done; done
