#!/bin/bash
# dlcp.bench.turns in turns: a base commit (a worktree built beside the checkout)
# and the checkout, PAIRS pairs, SIZES elements, MESSAGES a size; one JSON line a
# run in OUT, then each size's cpu_us and turns per tree (medians).
#   BASE=<commit> PAIRS=4 OUT=turns.jsonl docs/results/2026-12-01/posted_receives/ab_turns.sh
set -eu
here=$(pwd)
base=$(mktemp -d)/base
git worktree add -q "$base" "${BASE:?a base commit}"
trap 'git worktree remove --force "$base"' EXIT
(cd "$base" && python setup.py build_ext --inplace -q > /dev/null)
out=${OUT:-turns.jsonl}
: > "$out"
for _ in $(seq "${PAIRS:-4}"); do
  for tree in "$base" "$here"; do
    line=$(cd "$tree" && python -m dlcp.bench.turns --json --sizes "${SIZES:-1,16384,262144}" \
      --messages "${MESSAGES:-300}" 2> /dev/null | tail -1)
    name=$([ "$tree" = "$base" ] && echo base || echo new)
    echo "{\"tree\": \"$name\", \"run\": $line}" >> "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for size in rows[0]["run"]["sizes"]:
    for tree in ("base", "new"):
        figs = [r["run"]["sizes"][size] for r in rows if r["tree"] == tree]
        print(f"{size:>9} {tree:4} cpu_us {statistics.median(f['cpu_us'] for f in figs):9.1f} "
              f"{[f['cpu_us'] for f in figs]} receiver_turns "
              f"{statistics.median(f['receiver_turns'] for f in figs):.2f}")
PY
