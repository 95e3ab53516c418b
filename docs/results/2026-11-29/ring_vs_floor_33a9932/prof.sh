#!/bin/bash
# usage: prof.sh ring|floor ITERS [perf|strace|futex]
# Runs ring_or_floor.py as 4 local ranks and attaches the profiler to the loop only:
#   perf:   whole machine, CPU by thread and shared object -> KIND.comm_dso.txt
#   strace: rank 0's syscalls by count -> KIND.strace.txt
#   futex:  rank 0's futex calls with their call chains -> KIND.futex.data
set -e
here=$(cd "$(dirname "$0")" && pwd)
kind=$1; iters=$2; how=${3:-perf}
out=$(mktemp -d)
python -c "
import sys
from dlcp.launch import launch
r = launch([sys.executable, '$here/ring_or_floor.py', '$kind', '$iters', '$out'], 4, timeout=600)
print(r.returncode, r.message)" > "$here/$kind.$how.log" 2>&1 &
job=$!
until [ -e "$out/go" ]; do kill -0 $job 2>/dev/null || { cat "$here/$kind.$how.log"; exit 1; }; sleep 0.2; done
wait_done="until [ -e $out/done ]; do sleep 0.1; done"
rank0=$(for p in $(pgrep -f "ring_or_floor.py $kind"); do
  tr '\0' '\n' < /proc/$p/environ | grep -qx RANK=0 && echo $p; done | head -1)
case $how in
  perf) perf record -F 1999 -g -a -o "$out/perf.data" -- bash -c "$wait_done" 2>/dev/null
        perf report -i "$out/perf.data" --sort comm,dso --no-children -g none \
          -F overhead,sample,comm,dso 2>/dev/null | grep % > "$here/$kind.comm_dso.txt" ;;
  strace) strace -f -c -p "$rank0" -o "$here/$kind.strace.txt" & st=$!
          bash -c "$wait_done"; kill -INT $st; wait $st || true ;;
  futex) perf record -e syscalls:sys_enter_futex --call-graph dwarf,16384 -p "$rank0" \
           -o "$here/$kind.futex.data" -- bash -c "$wait_done" 2>/dev/null ;;
esac
wait $job
rm -rf "$out"
