#!/bin/bash
# usage: pairs.sh LABEL:TREE:SCENARIO:TRANSPORT:RATE ...   runs each in order, logging start/end and load
for spec in "$@"; do
  IFS=: read -r label tree sc tr rate <<< "$spec"
  out=/work/tbres-incast/runs/$label
  mkdir -p /work/tbres-incast/runs
  echo "$(date -u +%T) start $label ($tree $sc $tr ${rate}Mbit) load $(cut -d' ' -f1-3 /proc/loadavg) rev $(git -C $tree rev-parse --short HEAD)" >> /work/tbres-incast/runs/log
  (cd $tree && timeout 1200 .venv/bin/dlcp testbed run --scenario $sc --transport $tr --epochs 3 --hidden 1024 --link-rate $rate --results $out > $out.stdout 2>&1)
  echo "$(date -u +%T) end $label rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/tbres-incast/runs/log
done
