#!/bin/bash
# alternating plain runs (no profiler): every rank's wall and process CPU per 25 MB ring call
out=/tmp/turnwork/ab_plain.txt
for i in $(seq 1 ${ROUNDS:-4}); do
  for v in base new; do
    if [ $v = base ]; then PP=/tmp/turnwork/base; else PP=/work/wt-turn; fi
    (cd /tmp && PYTHONPATH=$PP SCRIPT=${PLAIN:-/work/prompts/ring_plain.py} /work/wt-turn/.venv/bin/python /work/prompts/launch_prof.py 2>&1 | grep -E "^\[rank.\]: rank . wall" | sed "s/^/$v $i /" >> $out)
    echo "$v $i load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out
  done
done
