#!/bin/bash
# usage: [ROUNDS=10] allreduce_ab.sh BEFORE_TREE AFTER_TREE OUTDIR
# The 25 MB all-reduce (4 local ranks, with the UDP floor: run as root) of two
# checkouts with their extensions built, in turns, ROUNDS rounds each (3 by default).
before=$1; after=$2; out=$3
for r in $(seq 1 ${ROUNDS:-3}); do for t in before after; do
  d=$before; [ $t = after ] && d=$after
  (cd "$d" && python -m dlcp.bench.allreduce --loopback --json --elems 6250000 --iters 6 \
     --rounds 3 2>/dev/null | tail -1 > "$out/allreduce_${t}_$r.json")
done; done
