#!/bin/bash
# incast at 50 Mbit/s, DLCP: HEAD (2f68a8e), the learned-settle trial, protected_weight 1; two
# rounds in turns. /tmp/wt_settle and /tmp/wt_w1 were git worktrees of 2f68a8e with the built
# extensions copied in and ../trial_learned_settle.diff, ../trial_protected_weight_1.diff applied;
# PYTHONPATH makes the ranks import the tree the run starts from.
run() {  # tree name
  cd $1 && PYTHONPATH=$1 /work/main/.venv/bin/python -m dlcp.cli testbed run --scenario incast --transport dlcp --epochs 3 --hidden 1024 --link-rate 50 --results /tmp/inc/turns/$2 > /tmp/inc/turns/$2.log 2>&1
}
mkdir -p /tmp/inc/turns
for r in 1 2; do
  run /work/main head-$r
  run /tmp/wt_settle settle-$r
  run /tmp/wt_w1 weight1-$r
done
echo done > /tmp/inc/turns/DONE

# A third round afterwards (turns3.sh): HEAD, protected_weight 1, protected_weight 4
# (/tmp/wt_w4: the same edit with 4), one run each:
#   run /work/main head-3; run /tmp/wt_w1 weight1-3; run /tmp/wt_w4 weight4-3
