#!/bin/bash
# 200 Mbit/s incast: default pieces, then 16 pieces of >= 128 KiB (both transports), in turns
cd /work/main
run() { .venv/bin/python -m dlcp.cli testbed run --scenario incast --transport $1 --epochs 3 --hidden 1024 --results /tmp/inc/ab/$2 > /tmp/inc/ab/$2-$1.log 2>&1; }
mkdir -p /tmp/inc/ab
for round in 1 2; do
  git checkout -q dlcp/collectives/ps.py
  run dlcp p8-$round; run gloo p8-$round
  sed -i 's/^PIECE_BYTES = 256 \* 1024/PIECE_BYTES = 128 * 1024/; s/^MAX_PIECES = 8/MAX_PIECES = 16/' dlcp/collectives/ps.py
  run dlcp p16-$round; run gloo p16-$round
  git checkout -q dlcp/collectives/ps.py
done
echo done > /tmp/inc/ab/DONE
