#!/usr/bin/env bash
# Run the pipeline example (2 ranks over "dlcp") RUNS times on the tree in the
# current directory, beside BUSY busy loops, and count the runs that fail.
# The busy loops are killed by pid at the end. Failed runs' output is kept in OUT.
#   RUNS=100 BUSY=4 EPOCHS=10 OUT=/tmp/p2p_race bash docs/results/2026-12-02/p2p_thread_race/repeat.sh
set -u
RUNS=${RUNS:-100}; BUSY=${BUSY:-4}; EPOCHS=${EPOCHS:-10}; OUT=${OUT:-/tmp/p2p_race}
mkdir -p "$OUT"
busy=()
for _ in $(seq 1 "$BUSY"); do sh -c 'while :; do :; done' & busy+=($!); done
trap '[ ${#busy[@]} -gt 0 ] && kill "${busy[@]}" 2>/dev/null' EXIT
failed=0
for i in $(seq 1 "$RUNS"); do
  if env -u DLCP_JOB_SECRET PYTHONPATH="$PWD" OMP_NUM_THREADS=1 timeout 300 \
      .venv/bin/dlcp launch -n 2 examples/pipeline_digits.py --backend dlcp \
      --epochs "$EPOCHS" --json "$OUT/figures.json" > "$OUT/run$i.log" 2>&1; then
    rm "$OUT/run$i.log"
  else
    failed=$((failed + 1))
  fi
done
echo "$failed of $RUNS runs failed (busy loops: $BUSY, epochs: $EPOCHS; logs in $OUT)"
