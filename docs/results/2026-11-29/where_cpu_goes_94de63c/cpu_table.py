"""CPU ms per iteration (or per call), by thread kind and shared object, from
``perf report --sort comm,dso -F overhead,sample,comm,dso`` output.

    python cpu_table.py REPORT SECONDS_PROFILED SECONDS_PER_ITERATION
"""

import collections
import re
import sys

FREQ = 1999  # perf record -F


def thread_kind(comm: str) -> str:
    comm = re.sub(r"-\d+$", "", comm)
    return {"python": "main (python)", "swapper": "idle"}.get(comm, comm)


def dso_group(dso: str) -> str:
    if dso.startswith("[kernel"):
        return "kernel"
    for key, name in (
        ("libpython", "libpython"),
        ("libc.so", "libc"),
        ("_multiarray", "numpy"),
        ("libtorch", "torch"),
        ("libc10", "torch"),
        ("_udpio", "dlcp C"),
        ("_engine", "dlcp C"),
        ("_kernels", "dlcp C"),
    ):
        if key in dso:
            return name
    return "other"


def main() -> None:
    path, seconds, per_iter = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    iters = seconds / per_iter
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        parts = line.split()
        if len(parts) < 4 or not parts[0].endswith("%"):
            continue
        samples, comm, dso = int(parts[1]), parts[2], " ".join(parts[3:])
        table[thread_kind(comm)][dso_group(dso)] += samples
    groups = ["kernel", "libpython", "libc", "numpy", "torch", "dlcp C", "other"]
    print(f"{'thread':<16}" + "".join(f"{g:>10}" for g in groups) + f"{'total':>10}")
    rows = sorted(table.items(), key=lambda kv: -sum(kv[1].values()))
    for kind, c in rows:
        ms = [1e3 * c[g] / FREQ / iters for g in groups]
        print(f"{kind:<16}" + "".join(f"{v:10.1f}" for v in ms) + f"{sum(ms):10.1f}")
    busy = sum(sum(c.values()) for k, c in table.items() if k != "idle")
    busy_ms = 1e3 * busy / FREQ / iters
    print(f"busy CPU ms per iteration: {busy_ms:.1f} ({iters:.0f} iterations profiled)")


main()
