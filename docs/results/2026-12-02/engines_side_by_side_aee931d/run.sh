#!/bin/bash
# both engines side by side, in turns: transport, ddp (as root: the namespace paths);
# the all-reduce benchmark runs the ring on both engines in one run
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-/tmp/engines}
mkdir -p "$OUT"
for e in native python; do
  DLCP_ENGINE=$e timeout 1200 .venv/bin/python -m dlcp.bench.transport --json --no-progress > $OUT/transport_$e.json 2> $OUT/transport_$e.err
  echo "transport $e rc=$?" >> $OUT/log
done
for e in native python; do
  DLCP_ENGINE=$e timeout 1800 .venv/bin/python -m dlcp.bench.ddp --json > $OUT/ddp_$e.json 2> $OUT/ddp_$e.err
  echo "ddp $e rc=$?" >> $OUT/log
done
timeout 1200 .venv/bin/python -m dlcp.bench.allreduce --loopback --elems 6250000 --iters 20 --rounds 3 --json > $OUT/allreduce.json 2> $OUT/allreduce.err
echo "allreduce rc=$?" >> $OUT/log
date >> $OUT/log
