#!/usr/bin/env bash
# Trial: the host bucket of 16 frames against 2, clean DLCP shaped, ABBA
set -u
OUTDIR=$1; B16=$2; B2=$3
mkdir -p "$OUTDIR"
PY=/work/wt-egress/.venv/bin/python
run() {
  local tag=$1 tree=$2
  local dir=/tmp/egress/runs/trial-$tag
  rm -rf "$dir"; mkdir -p "$dir"
  echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $tag" >> "$OUTDIR/order.txt"
  (cd /tmp && PYTHONPATH=$tree timeout 900 $PY -c 'import sys; from dlcp.cli import main; sys.exit(main())' \
     testbed run --scenario clean --transport dlcp --epochs 3 --hidden 1024 --results "$dir") > "$dir/log.txt" 2>&1
  echo "  rc $? $(grep -h 'accuracy' "$dir/log.txt" | tail -1 | cut -c1-120)" >> "$OUTDIR/order.txt"
  cp "$dir"/clean-dlcp-hidden1024.json "$OUTDIR/$tag-clean-dlcp-hidden1024.json"
}
run 1-burst16 $B16; run 1-burst2 $B2; run 2-burst2 $B2; run 2-burst16 $B16
echo done >> "$OUTDIR/order.txt"
