"""Sums ``threads_cpu.py``'s lines (four ranks a job) by kind of thread:
``python sum_threads.py threads_cpu.txt``."""

import collections
import pathlib
import re
import sys

LINE = re.compile(
    r"\]: (\w+) rank (\d): ([\d.]+) ms a call; per call, user / system ms and "
    r"context switches: (.*)"
)
THREAD = re.compile(r"([\w-]+) ([\d.]+) / ([\d.]+), (\d+)")


def kind_of(thread: str) -> str:
    if thread.startswith("dlcp-io"):
        return "io"
    if thread.startswith("dlcp-send"):
        return "send"
    return "caller" if thread == "python" else "other"


runs = []
for line in pathlib.Path(sys.argv[1]).read_text().splitlines():
    m = LINE.search(line)
    if m is None:
        continue
    total: collections.Counter[str] = collections.Counter()
    for name, user, system, switches in THREAD.findall(m.group(4)):
        total[kind_of(name) + "_u"] += float(user)
        total[kind_of(name) + "_s"] += float(system)
        total["switches"] += int(switches)
    total["wall"] = float(m.group(3)) / 4
    runs.append((m.group(1), total))
for i in range(0, len(runs), 4):
    s: collections.Counter[str] = collections.Counter()
    for _, t in runs[i : i + 4]:
        s.update(t)
    cpu = sum(v for k, v in s.items() if k.endswith(("_u", "_s")))
    print(
        f"{runs[i][0]:5s} wall {s['wall']:5.1f} ms a call; the 4 ranks' CPU ms a call: "
        f"I/O user {s['io_u']:5.1f} system {s['io_s']:5.1f}, caller user {s['caller_u']:5.1f} "
        f"system {s['caller_s']:4.1f}, send threads system {s['send_s']:5.1f}, all {cpu:6.1f}; "
        f"context switches {s['switches']:4.0f}"
    )
