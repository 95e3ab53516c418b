#!/bin/bash
# clean, loss, background at 50 Mbit/s, DLCP: the tree (16:1 leaves) and 1:1 leaves, in turns
# (/tmp/wt_w1: a git worktree of c0325f0 with ../trial_protected_weight_1.diff applied and
# the built extensions copied in)
run() { cd $1 && PYTHONPATH=$1 /work/main/.venv/bin/python -m dlcp.cli testbed run --scenario $3 --transport dlcp --epochs 3 --hidden 1024 --link-rate 50 --results /tmp/inc/scen/$2 > /tmp/inc/scen/$2-$3.log 2>&1; }
mkdir -p /tmp/inc/scen
for s in clean loss background; do
  run /work/main head $s
  run /tmp/wt_w1 weight1 $s
done
echo done > /tmp/inc/scen/DONE
