"""Reading on past the receive budget (RECEIVE_MORE_BYTES of a trial tree) or not, in
alternate calls of the 25 MB ring: CPU per call (4 ranks), rank 0's median wall and
receive calls per call:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ab_more.py', '60', '6250000', '0.05'], 4, timeout=900)"
"""

import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import dlcp.io.udp as udp
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="abmore")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]


def call():
    ring_allreduce(comm, data, segments=segments, p=p, average=True)


for _ in range(4):
    call()
more = udp.RECEIVE_MORE_BYTES
modes = ("off", "on")
cpu = {m: [] for m in modes}
wall = {m: [] for m in modes}
turns = {m: 0 for m in modes}
for i in range(iters):
    mode = modes[i % 2]
    udp.RECEIVE_MORE_BYTES = more if mode == "on" else 0
    dist.barrier()
    s0 = endpoint.stats()["receive_calls"]
    c0, w0 = time.process_time(), time.perf_counter()
    call()
    dist.barrier()
    cpu[mode].append(time.process_time() - c0)
    wall[mode].append(time.perf_counter() - w0)
    turns[mode] += endpoint.stats()["receive_calls"] - s0
t = torch.tensor([sum(cpu[m]) for m in modes], dtype=torch.float64)
dist.all_reduce(t)
if rank == 0:
    k = iters // 2
    print(
        f"ring, read on: CPU ms/call (4 ranks) off {t[0] / k * 1e3:.1f}, "
        f"on {t[1] / k * 1e3:.1f}, ratio {t[1] / t[0]:.3f}; rank0 median wall "
        f"{np.median(wall['off']) * 1e3:.1f} / {np.median(wall['on']) * 1e3:.1f}; "
        f"receive calls {turns['off'] / k:.1f} / {turns['on'] / k:.1f}"
    )
endpoint.close()
