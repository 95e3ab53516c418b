#!/bin/bash
# A = DLCP_PROBE_ROUTES=0 (equal shares per port, as before), B = default (routes probed).
# Run as root from the repository's root; TRIAL_COLLECTIVE needs the hunk in examples/train_digits.py.
run() { # A|B scenario link_rate round [collective]
  if [ "$1" = A ]; then export DLCP_PROBE_ROUTES=0; else unset DLCP_PROBE_ROUTES; fi
  if [ -n "$5" ]; then export TRIAL_COLLECTIVE=$5; tag=hd; else unset TRIAL_COLLECTIVE; tag=$2; fi
  .venv/bin/dlcp testbed run --scenario "$2" --transport dlcp --epochs 3 --hidden 1024 \
    --link-rate "$3" --results "/tmp/rp/$tag$3_$1_$4" > "/tmp/rp/$tag$3_$1_$4.log" 2>&1
  echo "$tag$3_$1_$4 rc=$?" >> /tmp/rp/status
}
run A clean 50 1 halving-doubling; run B clean 50 1 halving-doubling
run B clean 50 2 halving-doubling; run A clean 50 2 halving-doubling
run A clean 50 1; run B clean 50 1
run B loss 50 1; run A loss 50 1
run A clean 200 1; run B clean 200 1
echo done >> /tmp/rp/status
