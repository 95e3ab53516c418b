#!/bin/bash
# The benchmarks behind the README's engine table, at one commit, one after the
# other on a quiet machine (as root: namespaces and nftables).
#   bash run.sh OUT_DIR        (from the repository root, its .venv built)
set -euo pipefail
out=${1:?usage: run.sh OUT_DIR}
mkdir -p "$out"
py=.venv/bin/python
git rev-parse HEAD > "$out/commit.txt"
$py -m dlcp.bench.ddp --json --python-engine > "$out/ddp.out" 2> "$out/ddp.err"
$py -m dlcp.bench.allreduce --loopback --json > "$out/allreduce.out" 2> "$out/allreduce.err"
$py -m dlcp.bench.transport --json --no-progress > "$out/transport.out" 2> "$out/transport.err"
$py -m dlcp.bench.core --json > "$out/core.out" 2> "$out/core.err"
