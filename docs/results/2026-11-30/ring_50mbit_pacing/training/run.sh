#!/bin/bash
OUT=${OUT:-results-claim}; mkdir -p $OUT
for spec in "200 loss" "200 incast" "50 loss" "50 incast"; do
  set -- $spec
  for c in 0 1; do
    env TRIAL_CLAIM=$c .venv/bin/dlcp testbed run --scenario $2 --transport dlcp --epochs 3 --hidden 1024 --link-rate $1 --results $OUT/r$1_$2_c$c > $OUT/r$1_$2_c$c.log 2>&1
    echo "$1 $2 claim=$c: $(grep -o 'accuracy.*wall [0-9]* s' $OUT/r$1_$2_c$c.log) | $(grep -o 'ranks [0-9.]* CPU s' $OUT/r$1_$2_c$c.log) | $(grep -o 'lost [0-9.]*% of all.*retransmitted' $OUT/r$1_$2_c$c.log | tail -1)" >> $OUT/summary.txt
  done
done
echo done >> $OUT/summary.txt
