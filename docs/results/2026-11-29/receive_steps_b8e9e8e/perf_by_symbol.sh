#!/bin/bash
# usage: perf_by_symbol.sh ring|floor ITERS OUT.txt   (as root, from a checkout)
# ring_or_floor.py (../ring_vs_floor_33a9932/) as 4 local ranks; perf samples rank 0's
# threads over the measured loop only, and OUT.txt lists its symbols by thread and
# shared object, most samples first.
set -e
here=$(cd "$(dirname "$0")" && pwd)
kind=$1; iters=$2; report=$3
out=$(mktemp -d)
python -c "
import sys
from dlcp.launch import launch
r = launch([sys.executable, '$here/../ring_vs_floor_33a9932/ring_or_floor.py', '$kind', '$iters', '$out'], 4, timeout=600)
print(r.returncode, r.message)" > "$out/log" 2>&1 &
job=$!
until [ -e "$out/go" ]; do kill -0 $job 2>/dev/null || { cat "$out/log"; exit 1; }; sleep 0.2; done
rank0=$(for p in $(pgrep -f "ring_or_floor.py $kind"); do
  tr '\0' '\n' < /proc/$p/environ | grep -qx RANK=0 && echo $p; done | head -1)
perf record -F 4999 -p "$rank0" -o "$out/perf.data" -- bash -c "until [ -e $out/done ]; do sleep 0.1; done" 2>/dev/null
wait $job
perf report -i "$out/perf.data" --sort comm,dso,sym --no-children -F overhead,sample,comm,dso,sym \
  2>/dev/null | grep % | sort -k2 -rn > "$report"
grep "rank0\]" "$out/log" >> "$report.log" || true
rm -rf "$out"
