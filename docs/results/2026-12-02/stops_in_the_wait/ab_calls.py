"""STOPs taken in the receive loop's waits against STOPs read by Python, in
alternate calls of one job (the 25 MB ring all-reduce, 4 ranks, ``p = 0.05``):
the process CPU of every thread per call, summed over the ranks, and rank 0's
median wall time per call. Between calls every rank switches its table's STOP
taking on (``take_stops(STOP first byte, hold)``, as ``dlcp.io.control_in_waits``
does) or off (``take_stops(0, hold)``: every STOP is Python's, as before).

Run under dlcp.launch, 4 ranks on the loopback:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ab_calls.py', '100', '6250000', '0.05'], 4, timeout=900)"
"""

import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.io.control_in_waits import STOP_HOLD
from dlcp.proto.wire import VERSION, PacketType
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="ab")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
waits = endpoint._in_waits
assert waits is not None, "this endpoint takes no control frames in its waits"
table = waits._runs.table
first = (VERSION << 4) | PacketType.STOP


def call() -> None:
    ring_allreduce(comm, data, segments=segments, p=p, average=True)


for _ in range(4):
    call()
modes = ("python", "waits")
cpu: dict[str, list[float]] = {m: [] for m in modes}
wall: dict[str, list[float]] = {m: [] for m in modes}
for i in range(iters):
    mode = modes[i % 2]
    table.take_stops(first if mode == "waits" else 0, round(STOP_HOLD * 1e9))
    dist.barrier()
    c0, w0 = time.process_time(), time.perf_counter()
    call()
    dist.barrier()
    cpu[mode].append(time.process_time() - c0)
    wall[mode].append(time.perf_counter() - w0)
t = torch.tensor([sum(cpu[m]) for m in modes], dtype=torch.float64)
dist.all_reduce(t)
stats = endpoint.stats()
if rank == 0:
    k = iters // 2
    print(
        f"ring: CPU ms per call (4 ranks): STOPs read by Python {t[0] / k * 1e3:.1f}, "
        f"taken in the waits {t[1] / k * 1e3:.1f}, ratio {t[1] / t[0]:.3f}; rank 0 median "
        f"wall ms: {np.median(wall['python']) * 1e3:.1f} / {np.median(wall['waits']) * 1e3:.1f}; "
        f"rank 0 STOPs taken {stats['control_stops_native']}, rounds stopped "
        f"{stats['engine_rounds_stopped']}"
    )
endpoint.close()
