#!/usr/bin/env bash
# A fourth round at the final commit, with background too (see measure.sh)
set -u
TREE=$1; OUTDIR=$2
mkdir -p "$OUTDIR"
PY=/work/wt-egress/.venv/bin/python
run() {
  local r=$1 sc=$2 tr=$3 eg=$4
  local dir=/tmp/egress/runs/$r-$sc-$tr-$eg
  rm -rf "$dir"; mkdir -p "$dir"
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) round $r $sc $tr hosts $eg" >> "$OUTDIR/order.txt"
  (cd /tmp && PYTHONPATH=$TREE timeout 900 $PY -c 'import sys; from dlcp.cli import main; sys.exit(main())' \
     testbed run --scenario $sc --transport $tr --epochs 3 --hidden 1024 --host-egress $eg --results "$dir") \
     > "$dir/log.txt" 2>&1
  local rc=$?
  echo "  rc $rc $(grep -h 'accuracy' "$dir/log.txt" | tail -1)" >> "$OUTDIR/order.txt"
  for f in "$dir"/*.json; do [ -e "$f" ] && cp "$f" "$OUTDIR/$r-$(basename "$f")"; done
}
run 4 clean dlcp shaped; run 4 clean dlcp unshaped
run 4 incast dlcp unshaped; run 4 incast dlcp shaped
run 4 background dlcp shaped; run 4 background dlcp unshaped
run 4 background gloo unshaped; run 4 background gloo shaped
echo done >> "$OUTDIR/order.txt"
