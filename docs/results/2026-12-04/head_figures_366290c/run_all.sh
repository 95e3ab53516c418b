#!/bin/bash
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
out=${1:?usage: run_all.sh OUT_DIR}
bash docs/results/2026-12-04/head_figures/run.sh $out
py=.venv/bin/python
for i in 1 2 3; do $py -m dlcp.bench.allreduce --loopback --elems 6250000 --iters 6 --rounds 3 --json > $out/allreduce_25mb_$i.out 2> $out/allreduce_25mb_$i.err; done
for i in 2 3; do $py -m dlcp.bench.transport --json --no-progress > $out/transport_$i.out 2> $out/transport_$i.err; done
for i in 2 3; do $py -m dlcp.bench.core --json > $out/core_$i.out 2> $out/core_$i.err; done
echo done > $out/DONE
