#!/bin/bash
# bench.ddp once from each tree, base (a worktree of 88c7197 in /tmp/basewt) first, then the checkout (fe6392a)
for t in base new; do
  tree=$([ $t = base ] && echo /tmp/basewt || echo /work/main)
  line=$(cd $tree && timeout 1500 /work/main/.venv/bin/python -m dlcp.bench.ddp --json 2>/dev/null | tail -1)
  echo "{\"tree\": \"$t\", \"run\": $line}" >> /tmp/ab/ddp.jsonl
done
echo done > /tmp/ab/ddp.done
