"""CPU by thread name of one process, from /proc, sampled every 0.2 s until it exits
(the last sample of each thread counts): user and system seconds.

    python docs/results/2026-12-01/gil_handoffs/thread_cpu.py PID
"""

import glob
import os
import sys
import time

pid = int(sys.argv[1])
tick = os.sysconf("SC_CLK_TCK")
last: dict[str, tuple[str, float, float]] = {}  # task -> (name, user s, system s)
while os.path.exists(f"/proc/{pid}"):
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/comm") as f:
                name = f.read().strip()
            with open(f"{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # (the thread, or the process, ended meanwhile)
            continue
        last[task] = (name, int(fields[11]) / tick, int(fields[12]) / tick)
    time.sleep(0.2)
by_name: dict[str, list[float]] = {}
for name, user, system in last.values():
    row = by_name.setdefault(name, [0.0, 0.0, 0.0])
    row[0] += user
    row[1] += system
    row[2] += 1
for name, (user, system, n) in sorted(by_name.items(), key=lambda kv: -(kv[1][0] + kv[1][1])):
    total = user + system
    print(f"{name:20s} threads {n:3.0f}  cpu {total:6.2f} s  user {user:6.2f}  sys {system:6.2f}")
