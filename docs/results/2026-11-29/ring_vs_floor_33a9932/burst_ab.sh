#!/bin/bash
# The ring with the native engine's pacer burst at 200 us (the default) and 1 ms, in
# turns, three rounds of 40 calls: mean over the 4 ranks of wall and process CPU per call.
here=$(cd "$(dirname "$0")" && pwd)
for round in 1 2 3; do for b in 200e-6 1e-3; do
  out=$(mktemp -d)
  BURST_TIME=$b python -c "
import sys
from dlcp.launch import launch
r = launch([sys.executable, '$here/ring_or_floor.py', 'ring', '40', '$out'], 4, timeout=600)
sys.exit(r.returncode)" 2>&1 | grep -o 'wall [0-9.]* ms, process CPU [0-9.]*' |
    awk -v b=$b -v r=$round '{w += $2; c += $6} END {printf "round %d burst %s: wall %.1f ms, CPU %.1f ms per rank and call\n", r, b, w/NR, c/NR}'
  rm -rf "$out"
done; done
