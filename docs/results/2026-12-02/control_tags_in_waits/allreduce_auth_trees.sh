#!/bin/bash
# bench.allreduce --auth (the 25 MB ring, 4 ranks on the loopback), two trees in turns:
#   BASE=/path/to/base/tree NEW=/path/to/new/tree OUT=dir bash allreduce_auth_trees.sh
# Each tree needs its extensions built in place; the venv is the new tree's.
set -euo pipefail
: "${BASE:?the base tree}" "${NEW:?the new tree}" "${OUT:?where the JSON goes}"
PY=${PY:-$NEW/.venv/bin/python}
mkdir -p "$OUT"
for i in 1 2 3; do
  for t in base new; do
    dir=$BASE; [ "$t" = new ] && dir=$NEW
    (cd "$dir" && "$PY" -m dlcp.bench.allreduce --loopback --json --elems 6250000 --auth \
      2>/dev/null | tail -1 > "$OUT/$t.$i.json")
    python3 -c "
import json; d = json.load(open('$OUT/$t.$i.json'))
print('$t', $i, 'ring_cpu', d['ring_cpu_ms'], 'floor_cpu', d['floor_cpu_ms'],
      'ring/floor cpu', d['ring_over_floor_cpu'], 'ring_ms', d['ring_ms'], 'gloo_ms', d['gloo_ms'])"
  done
done
