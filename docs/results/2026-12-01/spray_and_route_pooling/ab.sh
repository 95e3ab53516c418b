#!/bin/bash
# A B A B testbed runs of DLCP over two environment settings, e.g.
#   TAG=spray50 COLL=halving-doubling SCEN=clean A="DLCP_SPRAY_PACKETS=44" \
#       B="DLCP_SPRAY_PACKETS=4" EXTRA="--link-rate 50" bash ab.sh
# COLL (a collective instead of the scenario's: ring, or ps in incast) needs the
# TRIAL_COLLECTIVE hunk of ../fan_in_caps/trial_switches.diff in
# examples/train_digits.py; without COLL the scenario's collective runs. TRIAL_POOL
# needs route_pooled_loss_trial.diff, TRIAL_SPAN and TRIAL_OVERLAP
# ../shared_reports_sequential_senders/overlap_rule_trial.diff.
# Results go to /tmp/share/$TAG_<A|B>_<run>.
cd "$(git rev-parse --show-toplevel)"
for r in 1 2; do for v in A B; do
  out=/tmp/share/${TAG:-x}_${v}_${r}
  rm -rf "$out"
  env ${!v} ${COLL:+TRIAL_COLLECTIVE=$COLL} .venv/bin/dlcp testbed run --scenario ${SCEN:-clean} \
    --transport dlcp --epochs 3 --hidden 1024 ${EXTRA} --results "$out" 2>&1 \
    | grep -o "accuracy.*ms/iter" | tr '\n' ' '
  python3 -c "
import json, glob
d = json.load(open(glob.glob('$out/*-dlcp*.json')[0]))
print(d['train']['collective'], 'lost', d['lost_fraction'], 'resent', d['retransmissions'], end=' ')"
  echo " $v: ${!v}"
done; done
