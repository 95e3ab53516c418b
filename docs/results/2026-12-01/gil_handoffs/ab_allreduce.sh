#!/bin/bash
# dlcp.bench.allreduce on the loopback, alternating a base commit (a worktree built
# beside the checkout) and the checkout as it is, PAIRS pairs; one JSON line a run in
# OUT, the medians and each run's figures printed.
#   BASE=<commit> PAIRS=6 EXTRA="--no-udp-floor" OUT=small.jsonl \
#     docs/results/2026-12-01/gil_handoffs/ab_allreduce.sh     (from a checkout's root)
set -eu
here=$(pwd)
base=$(mktemp -d)/base
git worktree add -q "$base" "${BASE:?a base commit}"
trap 'git worktree remove --force "$base"' EXIT
(cd "$base" && python setup.py build_ext --inplace -q > /dev/null)
out=${OUT:-ab_allreduce.jsonl}
: > "$out"
for _ in $(seq "${PAIRS:-6}"); do
  for tree in "$base" "$here"; do
    # (python -m puts the working directory first on the path: each tree runs its own code)
    line=$(cd "$tree" && python -m dlcp.bench.allreduce --loopback --json ${EXTRA:-} 2> /dev/null | tail -1)
    name=$([ "$tree" = "$base" ] && echo base || echo new)
    echo "{\"tree\": \"$name\", \"run\": $line}" >> "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
keys = ["ring_ms", "hd_ms", "ps_ms", "gloo_ms", "ring_cpu_ms", "hd_cpu_ms", "ps_cpu_ms",
        "gloo_cpu_ms", "ring_over_floor_cpu"]
for tree in ("base", "new"):
    runs = [r["run"] for r in rows if r["tree"] == tree]
    print(tree, " ".join(f"{k}={statistics.median(r[k] for r in runs):.3f}"
                         for k in keys if runs[0].get(k) is not None))
    for k in ("ring_ms", "ring_cpu_ms", "ring_over_floor_cpu"):
        if runs[0].get(k) is not None:
            print("   ", k, [r[k] for r in runs])
PY
