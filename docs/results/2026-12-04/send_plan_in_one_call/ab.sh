#!/bin/bash
# The 25 MB ring all-reduce (loopback, 4 ranks) from two checkouts in turns:
#   ab.sh OLD_DIR NEW_DIR OUT_DIR [FIRST LAST]
# each checkout's extensions built in place (python setup.py build_ext --inplace);
# OUT_DIR/{old,new}_N.out: the benchmark's output, its last line the JSON.
set -uo pipefail
old=${1:?OLD_DIR} new=${2:?NEW_DIR} out=${3:?OUT_DIR}
py=${PYTHON:-python}
mkdir -p "$out"
for i in $(seq "${4:-1}" "${5:-10}"); do
  for v in old new; do
    dir=$old; [ $v = new ] && dir=$new
    (cd "$dir" && PYTHONPATH=$dir $py -m dlcp.bench.allreduce --loopback --elems 6250000 \
      --iters 6 --rounds 3 --json > "$out/${v}_$i.out" 2> "$out/${v}_$i.err")
  done
done
