"""STOPs (or crossed FINISHes) taken in the receive loop's waits against read by
Python, in alternate calls of one job (the 25 MB ring all-reduce, 4 ranks,
``p = 0.05``): the process CPU of every thread per call, summed over the ranks,
and rank 0's median wall time per call. Between calls every rank switches its
table's taking of that frame on (``take_stops(STOP first byte, hold)``,
``take_finishes(FINISH first byte, window, keys)``, as ``dlcp.io.control_in_waits``
does) or off (a first byte of 0: every such frame is Python's, as before).

Run under dlcp.launch, 4 ranks on the loopback (``stops``, ``finishes`` or ``both``):

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ab_calls.py', '100', '6250000', '0.05', 'stops'], 4, timeout=900)"
"""

import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.io.control_in_waits import ENDED_KEYS, STOP_HOLD
from dlcp.proto.wire import VERSION, PacketType
from dlcp.rendezvous import connect

iters, n, p, what = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="ab")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
waits = endpoint._in_waits
assert waits is not None, "this endpoint takes no control frames in its waits"
table = waits._runs.table
window = round(endpoint._session.config.finish_timeout / 2 * 1e9)


def switch(on: bool) -> None:
    if what in ("stops", "both"):
        table.take_stops(((VERSION << 4) | PacketType.STOP) if on else 0, round(STOP_HOLD * 1e9))
    if what in ("finishes", "both"):
        table.take_finishes(((VERSION << 4) | PacketType.FINISH) if on else 0, window, ENDED_KEYS)



def call() -> None:
    ring_allreduce(comm, data, segments=segments, p=p, average=True)


for _ in range(4):
    call()
modes = ("python", "waits")
cpu: dict[str, list[float]] = {m: [] for m in modes}
wall: dict[str, list[float]] = {m: [] for m in modes}
for i in range(iters):
    mode = modes[i % 2]
    switch(mode == "waits")
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
        f"ring, {what}: CPU ms per call (4 ranks): read by Python {t[0] / k * 1e3:.1f}, "
        f"taken in the waits {t[1] / k * 1e3:.1f}, ratio {t[1] / t[0]:.3f}; rank 0 median "
        f"wall ms: {np.median(wall['python']) * 1e3:.1f} / {np.median(wall['waits']) * 1e3:.1f}; "
        f"rank 0 STOPs taken {stats['control_stops_native']}, rounds stopped "
        f"{stats['engine_rounds_stopped']}, FINISHes dropped {stats['control_finishes_native']}"
    )
endpoint.close()
