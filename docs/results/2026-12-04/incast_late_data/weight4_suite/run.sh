#!/bin/bash
# The four link-bound scenarios at 50 Mbit/s, DLCP with the tc profile's leaves at 16:1
# (the tree, /work/main) and 4:1 (/tmp/wt_w4: a worktree of the same commit with
# protected_weight 4 and the built extensions copied in), three rounds in turns, the order
# of the two trees swapped each round; Gloo (FIFO routers, the weight plays no part) once
# a scenario in the first round. PYTHONPATH makes the ranks import the run's tree.
run() {  # tree, name, scenario, transport
  cd $1 && PYTHONPATH=$1 /work/main/.venv/bin/python -m dlcp.cli testbed run --scenario $3 --transport $4 --epochs 3 --hidden 1024 --link-rate 50 --results /tmp/w4exp/$2 > /tmp/w4exp/$2-$3-$4.log 2>&1
}
for r in 1 2 3; do
  for s in incast loss clean background; do
    if [ $((r % 2)) = 1 ]; then
      run /work/main w16-$r $s dlcp; run /tmp/wt_w4 w4-$r $s dlcp
    else
      run /tmp/wt_w4 w4-$r $s dlcp; run /work/main w16-$r $s dlcp
    fi
    [ $r = 1 ] && run /work/main gloo-$r $s gloo
  done
done
echo done > /tmp/w4exp/DONE
