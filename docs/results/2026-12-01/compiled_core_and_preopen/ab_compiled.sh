#!/bin/bash
# The 25 MB ring all-reduce benchmark in alternate runs from two checkouts of the
# same commit: COMPILED (the protocol core's modules compiled with mypyc, see
# README.md) and PLAIN (as built by the package). One line per run:
# checkout, ring / floor CPU, ring CPU ms, floor CPU ms, ring ms, Gloo ms.
#   COMPILED=/tmp/compiled PLAIN=/work/main PYTHON=/work/main/.venv/bin/python bash ab_compiled.sh
set -eu
for _ in 1 2 3 4; do
  for tree in "$COMPILED" "$PLAIN"; do
    line=$(cd "$tree" && PYTHONPATH="$tree" timeout 600 "$PYTHON" -m dlcp.bench.allreduce \
      --loopback --elems 6250000 --iters 6 --rounds 3 --json 2>/dev/null | tail -1)
    echo "$line" | "$PYTHON" -c '
import json, sys
d = json.loads(sys.stdin.read())
print(sys.argv[1], d["ring_over_floor_cpu"], d["ring_cpu_ms"], d["floor_cpu_ms"],
      d["ring_ms"], d["gloo_ms"], sep="\t")' "$tree"
  done
done
