#!/bin/bash
# usage: linger_ab.sh OUTDIR ROUNDS: the 25 MB all-reduce with the receive linger off
# (DLCP_RECEIVE_LINGER=0) and at its default, in turns
out=$1; rounds=$2
for r in $(seq 1 $rounds); do for t in off on; do
  if [ $t = off ]; then export DLCP_RECEIVE_LINGER=0; else unset DLCP_RECEIVE_LINGER; fi
  python -m dlcp.bench.allreduce --loopback --json --elems 6250000 --iters 6 \
     --rounds 3 2>/dev/null | tail -1 > "$out/allreduce_${t}_$r.json"
done; done
