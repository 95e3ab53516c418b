"""FINISHes of messages under way kept by the receive loop's waits (applied after the
turn's data, or dropped if that data completed their message) against left on the
socket for Python, in alternate calls of one job (the 25 MB ring, 4 ranks, p = 0.05):
CPU per call summed over the ranks, rank 0's median wall, receive calls per call and
the FINISHes kept and applied:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ab_keep.py', '60', '6250000', '0.05'], 4, timeout=900)"
"""

import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.io.control_in_waits import ENDED_KEYS
from dlcp.proto.wire import VERSION, PacketType
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="abkeep")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
waits = endpoint._in_waits
assert waits is not None, "this endpoint takes no control frames in its waits"
table = waits._runs.table
window = round(endpoint._session.config.finish_timeout / 2 * 1e9)
first = (VERSION << 4) | PacketType.FINISH


def call() -> None:
    ring_allreduce(comm, data, segments=segments, p=p, average=True)


for _ in range(4):
    call()
modes = ("python", "kept")
cpu: dict[str, list[float]] = {m: [] for m in modes}
wall: dict[str, list[float]] = {m: [] for m in modes}
turns = dict.fromkeys(modes, 0)
applied = dict.fromkeys(modes, 0)
kept = dict.fromkeys(modes, 0)
for i in range(iters):
    mode = modes[i % 2]
    table.take_finishes(first, window, ENDED_KEYS, mode == "kept")
    dist.barrier()
    s0 = endpoint.stats()
    c0, w0 = time.process_time(), time.perf_counter()
    call()
    dist.barrier()
    cpu[mode].append(time.process_time() - c0)
    wall[mode].append(time.perf_counter() - w0)
    s1 = endpoint.stats()
    turns[mode] += s1["receive_calls"] - s0["receive_calls"]
    kept[mode] += s1["control_finishes_kept"] - s0["control_finishes_kept"]
t = torch.tensor([sum(cpu[m]) for m in modes], dtype=torch.float64)
dist.all_reduce(t)
if rank == 0:
    k = iters // 2
    print(
        f"ring, FINISHes under way: CPU ms per call (4 ranks): Python's {t[0] / k * 1e3:.1f}, "
        f"kept {t[1] / k * 1e3:.1f}, ratio {t[1] / t[0]:.3f}; rank 0 median wall ms "
        f"{np.median(wall['python']) * 1e3:.1f} / {np.median(wall['kept']) * 1e3:.1f}; "
        f"receive calls per call {turns['python'] / k:.1f} / {turns['kept'] / k:.1f}; "
        f"FINISHes kept per call {kept['kept'] / k:.1f}"
    )
endpoint.close()
