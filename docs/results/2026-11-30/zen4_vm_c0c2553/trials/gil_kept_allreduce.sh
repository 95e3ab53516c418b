#!/bin/bash
# usage: gil_kept_allreduce.sh OUTDIR ROUNDS: the 25 MB all-reduce with the GIL kept (default) and released
# (TRIAL_POST_GIL=0 TRIAL_CONTROL_GIL=0) in Engine.post's fast path and the control sends, in turns (a build with gil_kept.diff applied)
out=$1; rounds=$2
for r in $(seq 1 $rounds); do for t in off on; do
  if [ $t = off ]; then export TRIAL_POST_GIL=0 TRIAL_CONTROL_GIL=0; else unset TRIAL_POST_GIL TRIAL_CONTROL_GIL; fi
  python -m dlcp.bench.allreduce --loopback --json --elems 6250000 --iters 6 \
     --rounds 3 2>/dev/null | tail -1 > "$out/allreduce_${t}_$r.json"
done; done
