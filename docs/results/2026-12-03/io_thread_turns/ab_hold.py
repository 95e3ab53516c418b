"""The STOP hold (how long a STOP taken in a wait may wait for Python's next turn)
at two values in alternate calls of one job: the 25 MB ring all-reduce, 4 ranks,
``p = 0.05``. Between calls every rank sets its table's hold (``take_stops``, as
``dlcp.io.control_in_waits`` does). Per call: the process CPU of every thread summed
over the ranks, rank 0's median wall time and its I/O thread's turns (receive calls).

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ab_hold.py', '80', '6250000', '0.05', '0.002', '0.02'], 4, timeout=900)"
"""

import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.proto.wire import VERSION, PacketType
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
holds = (float(sys.argv[4]), float(sys.argv[5]))
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="hold")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
waits = endpoint._in_waits
assert waits is not None, "this endpoint takes no control frames in its waits"
table = waits._runs.table
stop_first = (VERSION << 4) | PacketType.STOP


def call() -> None:
    ring_allreduce(comm, data, segments=segments, p=p, average=True)


for _ in range(4):
    call()
cpu: dict[float, list[float]] = {h: [] for h in holds}
wall: dict[float, list[float]] = {h: [] for h in holds}
turns: dict[float, int] = {h: 0 for h in holds}
for i in range(iters):
    hold = holds[i % 2]
    table.take_stops(stop_first, round(hold * 1e9))
    dist.barrier()
    r0 = endpoint._stats.receive_calls
    c0, w0 = time.process_time(), time.perf_counter()
    call()
    dist.barrier()
    cpu[hold].append(time.process_time() - c0)
    wall[hold].append(time.perf_counter() - w0)
    turns[hold] += endpoint._stats.receive_calls - r0
t = torch.tensor([sum(cpu[h]) for h in holds], dtype=torch.float64)
dist.all_reduce(t)
if rank == 0:
    k = iters // 2
    a, b = holds
    print(
        f"hold {a * 1e3:g} ms / {b * 1e3:g} ms: CPU ms per call (4 ranks) {t[0] / k * 1e3:.1f} / "
        f"{t[1] / k * 1e3:.1f}, ratio {t[1] / t[0]:.3f}; rank 0 median wall ms "
        f"{np.median(wall[a]) * 1e3:.1f} / {np.median(wall[b]) * 1e3:.1f}; rank 0 turns per "
        f"call {turns[a] / k:.1f} / {turns[b] / k:.1f}"
    )
endpoint.close()
