#!/bin/bash
# DDP lossless loopback job, before (03199fe tree) and after (main) in turns
out=$1
for i in 1 2 3 4; do
  for side in before after; do
    if [ $side = before ]; then tree=/tmp/before; else tree=/work/main; fi
    if [ $((i % 2)) = 0 ]; then :; fi
    r=$(cd /tmp && PYTHONPATH=$tree ITERS=40 /work/main/.venv/bin/python /work/main/docs/results/2026-11-29/where_cpu_goes_94de63c/ddp_one.py dlcp 2>/dev/null | tail -1)
    echo "{\"round\": $i, \"side\": \"$side\", \"load\": $(cut -d' ' -f1 /proc/loadavg), \"fig\": $r}" >> $out
  done
  r=$(cd /tmp && PYTHONPATH=/work/main ITERS=40 /work/main/.venv/bin/python /work/main/docs/results/2026-11-29/where_cpu_goes_94de63c/ddp_one.py gloo 2>/dev/null | tail -1)
  echo "{\"round\": $i, \"side\": \"gloo\", \"load\": $(cut -d' ' -f1 /proc/loadavg), \"fig\": $r}" >> $out
done
echo done >> $out.done
