#!/bin/bash
# alternating cProfile runs: base (f441dbb) and new (wt-turn); rank 0's and all ranks' I/O thread
out=/tmp/turnwork/ab_prof.txt
for i in $(seq 1 ${ROUNDS:-4}); do
  for v in base new; do
    if [ $v = base ]; then PP=/tmp/turnwork/base; else PP=/work/wt-turn; fi
    rm -f /tmp/prof/io*.prof /tmp/prof/call*.prof
    (cd /tmp && PYTHONPATH=$PP NTOP=0 SCRIPT=/tmp/turnwork/ring_prof_callers.py /work/wt-turn/.venv/bin/python /work/prompts/launch_prof.py 2>&1 | grep -E "calls per|wall" | tr '\n' ' ' | sed "s/^/$v $i: /" >> $out)
    echo >> $out
    for r in 0 1 2 3; do echo "  $v $i rank$r io: $(python3 /tmp/turnwork/an.py /tmp/prof/io$r.prof 10 0)" >> $out; done
  done
done
