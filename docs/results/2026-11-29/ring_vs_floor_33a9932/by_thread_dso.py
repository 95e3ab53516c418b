"""CPU ms per call of the 4 ranks together, by thread (rank suffix dropped) and
shared object, from ``perf report --sort comm,dso -F overhead,sample,comm,dso``
sampled at 1,999 Hz: ``python by_thread_dso.py KIND.comm_dso.txt ITERS``.
Idle, the shell and perf itself, and kernel threads are left out."""

import collections
import re
import sys
from pathlib import Path

path, iters = sys.argv[1], int(sys.argv[2])
ms: dict[tuple[str, str], float] = collections.defaultdict(float)
for line in Path(path).read_text().splitlines():
    m = re.match(r"\s*([\d.]+)%\s+(\d+)\s+(.+?)\s{2,}(\S.*?)\s*$", line)
    if not m:
        continue
    samples, thread, dso = int(m[2]), re.sub(r"-\d+(\.\d+)?$", "", m[3].strip()), m[4]
    if thread in ("swapper", "bash", "sleep", "perf", "perf-exec") or thread.startswith("k"):
        continue
    dso = "kernel" if dso.startswith("[kernel") else dso.split(".")[0].split("-")[0]
    ms[(thread, dso)] += samples / 1999 / iters * 1e3
per_thread: dict[str, float] = collections.defaultdict(float)
for (thread, dso), v in sorted(ms.items(), key=lambda x: -x[1]):
    per_thread[thread] += v
    if v >= 0.5:
        print(f"{thread:16s} {dso:20s} {v:6.1f}")
for thread, v in sorted(per_thread.items(), key=lambda x: -x[1]):
    if v >= 0.5:
        print(f"{thread:16s} {'(all)':20s} {v:6.1f}")
print(f"{'total':37s} {sum(per_thread.values()):6.1f}")
