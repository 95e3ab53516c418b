"""In a job that authenticates: control frames taken in the receive loop's waits
(tagged RATEs, STOPs, crossed FINISHes) against all read by Python, in alternate calls
of one job (the 25 MB ring, 4 ranks, p = 0.05): CPU per call summed over the ranks,
rank 0's median wall, receive calls and control frames read by Python per call.

    DLCP_AUTHENTICATE=1 python -c "import sys; from dlcp.launch import launch; launch(
        [sys.executable, 'ab_auth.py', '60', '6250000', '0.05'], 4, timeout=900)"
"""

import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.io.control_in_waits import ENDED_KEYS, STOP_HOLD
from dlcp.io.engine import _native
from dlcp.proto.control import RATE_SHARED
from dlcp.proto.wire import VERSION, Flags, PacketType
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="abauth")
assert endpoint._session.keys is not None, "this job does not authenticate"
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
waits = endpoint._in_waits
assert waits is not None, "this endpoint takes no control frames in its waits"
table = waits._runs.table
window = round(endpoint._session.config.finish_timeout / 2 * 1e9)


def switch(on: bool) -> None:
    first = lambda t: ((VERSION << 4) | t) if on else 0  # noqa: E731
    table.take_rates(
        _native.PACER_API,
        endpoint._session.job,
        first(PacketType.RATE),
        RATE_SHARED,
        int(Flags.AUTH),
    )
    table.take_stops(first(PacketType.STOP), round(STOP_HOLD * 1e9))
    table.take_finishes(first(PacketType.FINISH), window, ENDED_KEYS)


def call() -> None:
    ring_allreduce(comm, data, segments=segments, p=p, average=True)


for _ in range(4):
    call()
modes = ("python", "waits")
cpu = {m: [] for m in modes}
wall = {m: [] for m in modes}
turns = {m: 0 for m in modes}
read = {m: 0 for m in modes}
for i in range(iters):
    mode = modes[i % 2]
    switch(mode == "waits")
    dist.barrier()
    s0 = endpoint.stats()
    c0, w0 = time.process_time(), time.perf_counter()
    call()
    dist.barrier()
    cpu[mode].append(time.process_time() - c0)
    wall[mode].append(time.perf_counter() - w0)
    s1 = endpoint.stats()
    turns[mode] += s1["receive_calls"] - s0["receive_calls"]
    read[mode] += (s1["control_in"] - s1["control_stops_native"]) - (
        s0["control_in"] - s0["control_stops_native"]
    )
t = torch.tensor([sum(cpu[m]) for m in modes], dtype=torch.float64)
dist.all_reduce(t)
if rank == 0:
    k = iters // 2
    print(
        f"ring, authenticated: CPU ms per call (4 ranks): read by Python {t[0] / k * 1e3:.1f}, "
        f"taken in the waits {t[1] / k * 1e3:.1f}, ratio {t[1] / t[0]:.3f}; rank 0 median wall "
        f"ms {np.median(wall['python']) * 1e3:.1f} / {np.median(wall['waits']) * 1e3:.1f}; "
        f"rank 0 receive calls per call {turns['python'] / k:.1f} / {turns['waits'] / k:.1f}, "
        f"control frames read by Python per call {read['python'] / k:.1f} / {read['waits'] / k:.1f}"
    )
endpoint.close()
