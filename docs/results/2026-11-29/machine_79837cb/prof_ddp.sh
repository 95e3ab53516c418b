#!/bin/bash
# perf 10 s of a DDP job, 20 s after the start
set -e
t=$1
(ITERS=${ITERS:-120} python $(dirname "$0")/../where_cpu_goes_94de63c/ddp_one.py $t > /tmp/$t.out 2>&1) &
job=$!
sleep 20   # (profiling window placement only; not readiness)
perf record -F 1999 -g -a -o /tmp/$t.data -- sleep 10 2>/dev/null
wait $job
perf report -i /tmp/$t.data --sort comm,dso --no-children -g none -F overhead,sample,comm,dso 2>/dev/null | grep % > /tmp/$t.comm_dso.txt
cat /tmp/$t.out | tail -1
