#!/bin/bash
# dlcp.bench.core in turns: a base commit (a worktree built beside the checkout, its
# harness as it was) and the checkout on each receive path, ROUNDS rounds; one JSON
# line a run in OUT, then each kind's ratios and their median.
#   BASE=<commit> ROUNDS=6 OUT=core.jsonl docs/results/2026-12-01/core_receive_path/ab_core.sh
set -eu
here=$(pwd)
base=$(mktemp -d)/base
git worktree add -q "$base" "${BASE:?a base commit}"
trap 'git worktree remove --force "$base"' EXIT
(cd "$base" && python setup.py build_ext --inplace -q > /dev/null)
out=${OUT:-core.jsonl}
: > "$out"
for _ in $(seq "${ROUNDS:-6}"); do
  for kind in base native python; do
    if [ "$kind" = base ]; then
      line=$(cd "$base" && python -m dlcp.bench.core --json 2> /dev/null | tail -1)
    else
      line=$(cd "$here" && python -m dlcp.bench.core --json --receive-path "$kind" 2> /dev/null | tail -1)
    fi
    echo "{\"kind\": \"$kind\", \"run\": $line}" >> "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for kind in ("base", "native", "python"):
    runs = [r["run"] for r in rows if r["kind"] == kind]
    ratios = [r["ratio"] for r in runs]
    print(f"{kind:7} ratio median {statistics.median(ratios):.3f} runs {ratios} "
          f"core_s {[r['core_s'] for r in runs]} memcpy_s {[r['memcpy_s'] for r in runs]}")
PY
