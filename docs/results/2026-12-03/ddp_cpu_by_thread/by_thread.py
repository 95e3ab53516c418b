"""CPU seconds of a DDP job's threads by kind and shared object, from a
``perf report --sort comm,dso -n -q --stdio`` listing of a ``perf record -a -F 1999``
run (``ddp_one.py``):

    python by_thread.py perf_dlcp_comm_dso.txt perf_gloo_comm_dso.txt
"""

import re
import sys
from collections import defaultdict

HZ = 1999
RANKS = 4
ITERATIONS = 43  # the job's 3 warm-up and 40 measured iterations
#: the threads that move gradients: DLCP's I/O, send and hook threads; Gloo's loops
DLCP_THREADS = ("dlcp-",)
GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")


def kind(comm: str) -> str:
    return re.sub(r"-\d+$", "-N", comm)


def dso_class(dso: str) -> str:
    if dso.startswith("libpython"):
        return "interpreter"
    if dso == "[kernel.kallsyms]":
        return "kernel"
    return "other"


for path in sys.argv[1:]:
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    with open(path) as listing:
        for line in listing:
            parts = line.split()
            if len(parts) < 4 or not parts[0].endswith("%"):
                continue
            samples, comm, dso = int(parts[1]), parts[2], parts[3]
            seconds[kind(comm), dso_class(dso)] += samples / HZ
    print(f"== {path} (CPU s over the job; ms an iteration a rank)")
    for (k, c), s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        if s >= 0.1:
            print(f"  {k:16s} {c:12s} {s:6.2f} s  {1e3 * s / RANKS / ITERATIONS:6.1f} ms")
    # DLCP's threads and Gloo's (every row of them, however small): a DLCP job has
    # Gloo's too, for the process group DDP starts with and the benchmark's barriers
    for name, prefixes in (("DLCP's", DLCP_THREADS), ("Gloo's", GLOO_THREADS)):
        moving: dict[str, float] = defaultdict(float)
        for (k, c), s in seconds.items():
            if k.startswith(prefixes):
                moving[c] += s
        per = {c: 1e3 * s / RANKS / ITERATIONS for c, s in sorted(moving.items())}
        parts = ", ".join(f"{c} {ms:.1f}" for c, ms in per.items())
        print(f"  {name} threads, ms an iteration a rank: {parts}; in all {sum(per.values()):.1f}")
