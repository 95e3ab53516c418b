"""CPU per thread (user and system, from /proc) and context switches per call, of the
25 MB ring (KIND=ring), of halving-doubling (KIND=hd) or of the ring's UDP floor
(KIND=floor), every rank, over ITERS calls after 3 warm-up calls
(``../../2026-12-02/ring_floor_by_thread/threads_cpu.py`` with halving-doubling
added). From this directory, as root (the floor's receive buffers):

    DLCP_FINISH_TIMEOUT=5 python -c "import sys; from dlcp.launch import launch;
        launch([sys.executable, 'threads_cpu.py', '40', '6250000', '0.05', 'KIND'], 4,
        timeout=600)"
"""

import os
import sys
import time

import numpy as np
import torch.distributed as dist

import dlcp.collectives.ring as ring
from dlcp.bench.ddp_floor import UdpRingFloor
from dlcp.collectives import Communicator, halving_doubling_allreduce
from dlcp.rendezvous import connect

iters, n, p, kind = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo")
rank = dist.get_rank()
TICK = os.sysconf("SC_CLK_TCK")


def threads() -> dict[tuple[str, str], tuple[float, float, int]]:
    """(tid, name) -> (user s, system s, context switches) of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/status") as f:
                status = f.read()
        except OSError:  # (a thread that ended meanwhile)
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        switches = sum(
            int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
        )
        out[(tid, name)] = (int(fields[11]) / TICK, int(fields[12]) / TICK, switches)
    return out


data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="threadcpu")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
floor = UdpRingFloor(rank, job.world_size)
every: list = [None] * job.world_size
dist.all_gather_object(every, floor.addresses)
floor.connect(every)
floor_data = data.copy()
if kind == "floor":

    def call() -> None:
        floor.allreduce(floor_data)
elif kind == "hd":

    def call() -> None:
        halving_doubling_allreduce(comm, data, segments=segments, p=p, average=True)
else:

    def call() -> None:
        ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)


for _ in range(3):
    call()
dist.barrier()
before, t0 = threads(), time.perf_counter()
for _ in range(iters):
    call()
wall = time.perf_counter() - t0
after = threads()
dist.barrier()
rows = []
for key, (u, s, c) in after.items():
    u0, s0, c0 = before.get(key, (0.0, 0.0, 0))
    if u + s - u0 - s0 > 0 or c - c0 > 0:
        rows.append((key[1], 1e3 * (u - u0) / iters, 1e3 * (s - s0) / iters, (c - c0) / iters))
rows.sort(key=lambda r: -(r[1] + r[2]))
print(
    f"{kind} rank {rank}: {1e3 * wall / iters:.1f} ms a call; per call, user / system ms "
    "and context switches: "
    + ", ".join(f"{name} {u:.1f} / {s:.1f}, {c:.0f}" for name, u, s, c in rows),
    flush=True,
)
floor.close()
endpoint.close()
