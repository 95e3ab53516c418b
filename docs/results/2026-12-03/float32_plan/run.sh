#!/usr/bin/env bash
# plan_message's float32 fast path: bench.turns --bytecodes and plan_timing.py at the
# commit before it (87a6edc) and at it (c6e062b), in turns, three rounds.
set -u
for round in 1 2 3; do
  for rev in 87a6edc c6e062b; do
    cd /tmp/w/t_$rev
    PYTHONPATH=$PWD .venv/bin/python -m dlcp.bench.turns --bytecodes --json 2>/dev/null | tail -1 > /tmp/w/plan/turns_${rev}_$round.json
    PYTHONPATH=$PWD .venv/bin/python /tmp/w/plan/plan_timing.py > /tmp/w/plan/plan_timing_${rev}_$round.json
  done
done
# then three more rounds of plan_timing.py alone (plan_timing_*_{4,5,6}.json):
for round in 4 5 6; do
  for rev in 87a6edc c6e062b; do
    (cd /tmp/w/t_$rev && PYTHONPATH=$PWD .venv/bin/python /tmp/w/plan/plan_timing.py \
      > /tmp/w/plan/plan_timing_${rev}_$round.json)
  done
done
