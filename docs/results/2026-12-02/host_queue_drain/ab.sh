#!/bin/bash
# The testbed runs of the base tree and this one in turns (each built in place; see
# ../../2026-12-01/steady_rate_windows/ab_trees.sh): loss and clean at 50 Mbit/s,
# clean at 200 and incast at 50. Root, from the repository's root:
#   git worktree add /tmp/basewt e30cc24 && (cd /tmp/basewt && ln -s $PWD/.venv . &&
#     .venv/bin/python setup.py build_ext --inplace)
#   TREES="base=/tmp/basewt drain=$PWD" OUT=ab.txt docs/results/2026-12-02/host_queue_drain/ab.sh
set -eu
ab=docs/results/2026-12-01/steady_rate_windows/ab_trees.sh
SCENARIO=loss RATE=50 PAIRS=${LOSS_PAIRS:-3} $ab
SCENARIO=clean RATE=50 PAIRS=${PAIRS:-2} $ab
SCENARIO=clean RATE=200 PAIRS=${PAIRS:-2} $ab
SCENARIO=incast RATE=50 PAIRS=1 $ab
