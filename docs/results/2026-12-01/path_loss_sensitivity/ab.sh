#!/bin/bash
# The testbed runs of this folder: A = loss_sensitivity 10 (before), B = 100, through the
# trial switch TRIAL_LOSS_SENS (README). Run as root from the repository's root with the
# switch applied; each run writes its JSON under /tmp/ls/.
run() { # A|B scenario link_rate round
  if [ "$1" = A ]; then export TRIAL_LOSS_SENS=10; else export TRIAL_LOSS_SENS=100; fi
  .venv/bin/dlcp testbed run --scenario "$2" --transport dlcp --epochs 3 --hidden 1024 \
    --link-rate "$3" --results "/tmp/ls/$2$3_$1_$4" > "/tmp/ls/$2$3_$1_$4.log" 2>&1
}
run A loss 50 1; run B loss 50 1; run A loss 50 2; run B loss 50 2
run B loss 50 3; run A loss 50 3
run A clean 50 1; run B clean 50 1
run B loss 200 1; run A loss 200 1
run A incast 50 1; run B incast 50 1
