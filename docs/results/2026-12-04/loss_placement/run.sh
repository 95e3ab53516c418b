#!/bin/bash
# Three pairs of transport runs in turns, as root, from the repository root: as it
# is, and with the sending worker pinned to CPU 0 and the receiving one to CPU 1
# (this folder's sitecustomize.py). Both resolve one send thread (the benchmark's
# two workers share the host), as the JSON's engine_threads says.
set -eu
here=$(dirname "$0")
cmd=(.venv/bin/python -m dlcp.bench.transport --json --no-progress --lossless-repetitions 2 --repetitions 20)
for pair in 1 2 3; do
    "${cmd[@]}" > "$here/default_$pair.out"
    PYTHONPATH="$here" PIN_SEND_CPU=0 PIN_RECV_CPU=1 "${cmd[@]}" > "$here/pinned_$pair.out"
done
