#!/usr/bin/env bash
# Runs the host-egress comparison in turns; each run's JSON copied to $OUTDIR as
# <round>-<name>.json, one line per run (start, load, name) in $OUTDIR/order.txt
set -u
TREE=$1; OUTDIR=$2
mkdir -p "$OUTDIR"
PY=/work/wt-egress/.venv/bin/python
run() {  # round scenario transport egress
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
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then a=shaped; b=unshaped; else a=unshaped; b=shaped; fi
  run $r clean dlcp $a; run $r clean dlcp $b
  run $r incast dlcp $b; run $r incast dlcp $a
  run $r clean gloo $a; run $r clean gloo $b
done
echo done >> "$OUTDIR/order.txt"
