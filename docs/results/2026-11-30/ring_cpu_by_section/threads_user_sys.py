"""User and system CPU of each kind of thread, summed over the 4 ranks, per call of
the 25 MB ring all-reduce and of its UDP floor, in turns (run as root, under
dlcp.launch):

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'threads_user_sys.py', '20', '6250000', '4', '0.05'], 4, timeout=900)"

Arguments: calls per round, float32 elements, rounds, the ring's p. Threads are
read from /proc (utime, stime); the main thread is the caller."""

import os
import sys
from pathlib import Path

import numpy as np
import torch.distributed as dist

from dlcp.bench.allreduce import _floor
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

iters, n, rounds, p = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
HZ = os.sysconf("SC_CLK_TCK")


def snap() -> dict[str, list[float]]:
    """Per thread kind (the OS name up to its rank number): [user, system] seconds."""
    out: dict[str, list[float]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # (the thread ended)
            continue
        if name.startswith("python"):
            name = "main" if task.name == str(os.getpid()) else "python-other"
        kind = "-".join(name.split("-")[:2])
        sums = out.setdefault(kind, [0.0, 0.0])
        sums[0] += int(fields[11]) / HZ
        sums[1] += int(fields[12]) / HZ
    return out


def per_call_ms(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, list[float]]:
    zero = [0.0, 0.0]
    return {k: [(b[k][i] - a.get(k, zero)[i]) * 1e3 / iters for i in (0, 1)] for k in b}


data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="threads-user-sys")
comm = Communicator(endpoint, job.world_size, channel=1)
floor, why = _floor(rank, job.world_size)
assert floor is not None, why
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
floor_data = data.copy()
calls = {
    "ring": lambda: ring_allreduce(comm, data, segments=segments, p=p, average=True),
    "floor": lambda: floor.allreduce(floor_data),
}
for call in calls.values():
    for _ in range(2):
        call()
results: dict[str, list[dict[str, list[float]]]] = {k: [] for k in calls}
for r in range(rounds):
    order = list(calls.items()) if r % 2 == 0 else list(reversed(calls.items()))
    for kind, call in order:
        dist.barrier()
        before = snap()
        for _ in range(iters):
            call()
        after = snap()
        dist.barrier()
        results[kind].append(per_call_ms(before, after))
gathered: list[dict[str, list[dict[str, list[float]]]] | None] = [None] * job.world_size
dist.all_gather_object(gathered, results)
if rank == 0:
    for kind in calls:
        print("=====", kind)
        for r in range(rounds):
            total: dict[str, list[float]] = {}
            for ranks_results in gathered:
                assert ranks_results is not None
                for thread, (user, system) in ranks_results[kind][r].items():
                    sums = total.setdefault(thread, [0.0, 0.0])
                    sums[0] += user
                    sums[1] += system
            shown = ", ".join(
                f"{t}: user {u:.1f} sys {s:.1f}" for t, (u, s) in sorted(total.items()) if u or s
            )
            print(f"round {r}: {shown} | total {sum(u + s for u, s in total.values()):.1f} ms")
floor.close()
endpoint.close()
