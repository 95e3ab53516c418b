#!/bin/bash
# Per one-element message of `dlcp.bench.turns` (two endpoints of one process, one
# message at a time): futex calls, context switches and task-clock, from `perf stat`
# over a run of 1 + MESSAGES (3,000) messages less a run of 1 (start-up and teardown
# cancel out).
#   docs/results/2026-12-01/gil_handoffs/per_message.sh LABEL   (from a checkout's root,
#   as root for the syscall tracepoint; DLCP_ENGINE, SIZE=elements and MESSAGES pass)
set -eu
label=${1:-run}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
many=$((1 + ${MESSAGES:-3000}))
for n in 1 $many; do
  perf stat -e 'syscalls:sys_enter_futex,context-switches,task-clock' -x, -o "$tmp/$n.txt" \
    python -m dlcp.bench.turns --sizes "${SIZE:-1}" --messages "$n" --warmup 5 > /dev/null 2>&1
done
python3 - "$label" "$tmp" "$many" <<'PY'
import sys
def load(path):
    out = {}
    for line in open(path):
        f = line.strip().split(",")
        if len(f) > 3 and not line.startswith("#"):
            out[f[2]] = float(f[0])
    return out
label, tmp, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
one, many = load(f"{tmp}/1.txt"), load(f"{tmp}/{n}.txt")
per = {k: (many[k] - one[k]) / (n - 1) for k in many}
print(f"{label:14s} futex {per['syscalls:sys_enter_futex']:6.2f}  "
      f"switches {per['context-switches']:6.2f}  task-clock {1000 * per['task-clock']:7.1f} us")
PY
