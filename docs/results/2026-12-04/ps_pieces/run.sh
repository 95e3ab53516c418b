#!/bin/sh
# The testbed's incast at RATE Mbit/s (default 50), both transports, the parameter servers in
# pieces (this tree) and whole (OLD: a worktree of the commit before them, with
# this tree's built extensions copied in), in turns. Run as root from the
# repository's root: sh docs/results/2026-12-04/ps_pieces/run.sh OLD_TREE OUT ROUNDS RATE
# The ranks run examples/train_digits.py of this tree, which imports dlcp and
# shims from PYTHONPATH (imports.txt says from where); the testbed's own code is
# this tree's in both arms (unchanged between them), so every JSON's code_rev
# names this tree.
set -e
old=$1 out=$2 rounds=${3:-2} rate=${4:-50}
mkdir -p "$out"
for tree in "$PWD" "$old"; do
    (cd examples && PYTHONPATH=$tree ../.venv/bin/python -c \
        "import dlcp.collectives.ps as p, shims.tcp_ps as t; print(p.__file__, t.__file__)")
done > "$out/imports.txt"
run() {  # tree label transport round
    PYTHONPATH=$1 .venv/bin/python -m dlcp.cli testbed run --scenario incast \
        --transport "$3" --epochs 3 --hidden 1024 --link-rate "$rate" \
        --results "$out/$2-$3-$4" > "$out/$2-$3-$4.log" 2>&1
}
for i in $(seq 1 "$rounds"); do
    run "$PWD" pieces dlcp "$i"
    run "$PWD" pieces gloo "$i"
    run "$old" whole dlcp "$i"
    run "$old" whole gloo "$i"
done
