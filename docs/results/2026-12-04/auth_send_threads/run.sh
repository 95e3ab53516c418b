#!/bin/bash
# Three pairs in turns, as root, from the repository root: the transport benchmark
# with one send thread (what its two workers sharing this 2-CPU host resolve) and
# with two (what `auto` gives a lone rank on a host of 2 CPUs or more).
set -eu
here=$(dirname "$0")
cmd=(.venv/bin/python -m dlcp.bench.transport --json --no-progress --lossless-repetitions 12 --repetitions 1)
for pair in 1 2 3; do
    DLCP_ENGINE_THREADS=1 "${cmd[@]}" > "$here/threads1_$pair.out"
    DLCP_ENGINE_THREADS=2 "${cmd[@]}" > "$here/threads2_$pair.out"
done
