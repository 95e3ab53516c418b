#!/bin/bash
# Needs the trial switches TRIAL_LOSS_SENS (README) and TRIAL_COLLECTIVE (examples/train_digits.py:
# args.collective = os.environ["TRIAL_COLLECTIVE"] where set, as in ../fan_in_caps/trial_switches.diff).
# halving-doubling clean at 50 Mbit/s, A = loss_sensitivity 10, B = 100, A B A B
# (run as root from the repository's root)
export TRIAL_COLLECTIVE=halving-doubling
for r in 1 2; do for m in A B; do
  if [ $m = A ]; then export TRIAL_LOSS_SENS=10; else export TRIAL_LOSS_SENS=100; fi
  .venv/bin/dlcp testbed run --scenario clean --transport dlcp --epochs 3 --hidden 1024 --link-rate 50 --results /tmp/hd/hd50_${m}_$r > /tmp/hd/hd50_${m}_$r.log 2>&1
  echo "$m $r rc=$?" >> /tmp/hd/status
done; done
echo done >> /tmp/hd/status
