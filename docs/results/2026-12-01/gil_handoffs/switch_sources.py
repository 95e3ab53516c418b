"""Where a message's context switches come from: `perf record` of the scheduler's
switch event with DWARF call stacks over MESSAGES (400) messages of SIZE (1) elements
of `dlcp.bench.turns`, each switch named by the first four user-space frames above
the kernel's (the interpreter's frame evaluation and lock plumbing left out).

    [SIZE=6250000 MESSAGES=20] python docs/results/2026-12-01/gil_handoffs/switch_sources.py
    (as root, from a checkout's root)
"""

import collections
import os
import subprocess
import sys
import tempfile

SKIP = ("__", "schedule", "futex", "do_", "entry_", "x64", "ep_", "exit_to_user", "PyCOND",
        "PyThread_acquire", "acquire_timed", "lll_", "_PyObject", "method_vectorcall",
        "PyObject_Vectorcall", "_PyEval_EvalFrame", "cfunction", "sock_call")  # fmt: skip
MESSAGES = int(os.environ.get("MESSAGES", "400"))
SIZE = os.environ.get("SIZE", "1")

with tempfile.TemporaryDirectory() as tmp:
    data = f"{tmp}/perf.data"
    subprocess.run(
        ["perf", "record", "-q", "-e", "sched:sched_switch", "--call-graph", "dwarf,16384",
         "-o", data, sys.executable, "-m", "dlcp.bench.turns", "--sizes", SIZE,
         "--messages", str(MESSAGES), "--warmup", "5"],
        check=True, capture_output=True,
    )  # fmt: skip
    script = subprocess.run(
        ["perf", "script", "-i", data], check=True, capture_output=True, text=True
    ).stdout
counts: collections.Counter[str] = collections.Counter()
for sample in script.split("\n\n"):
    lines = [line.strip() for line in sample.strip().splitlines() if line.strip()]
    if len(lines) < 2:
        continue
    frames = [line.split()[1] if len(line.split()) > 1 else "?" for line in lines[1:]]
    counts[" < ".join([f for f in frames if not f.startswith(SKIP)][:4])] += 1
total = sum(counts.values())
print(f"{total / MESSAGES:.2f} switches per message (perf's own cost included)")
for where, n in counts.most_common(16):
    print(f"{100 * n / total:5.1f} % {where}")
