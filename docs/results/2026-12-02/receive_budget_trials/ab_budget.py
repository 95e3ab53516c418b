"""Receive budget 4 MB against BIG bytes in alternate calls of the 25 MB ring: CPU per
call (4 ranks), rank 0's median wall, its receive calls per call by whether they ended
at the budget (backlog):

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ab_budget.py', '60', '6250000', '0.05', str(16 << 20)], 4, timeout=900)"
"""

import collections
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import dlcp.io.udp as udp
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

iters, n, p, big = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
budget = [udp.RECEIVE_BUDGET_BYTES]
ends = collections.Counter()
orig = udp.DataSockets.receive


def receive(self, deliver, budget_=None, **kw):
    r = orig(self, deliver, budget=budget[0], **kw)
    ends[(budget[0], self.backlog)] += 1
    return r


udp.DataSockets.receive = receive
endpoint, job = connect(group="abb")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]


def call():
    ring_allreduce(comm, data, segments=segments, p=p, average=True)


for _ in range(4):
    call()
modes = (4 << 20, big)
cpu = {m: [] for m in modes}
wall = {m: [] for m in modes}
ends.clear()
for i in range(iters):
    mode = modes[i % 2]
    budget[0] = mode
    dist.barrier()
    c0, w0 = time.process_time(), time.perf_counter()
    call()
    dist.barrier()
    cpu[mode].append(time.process_time() - c0)
    wall[mode].append(time.perf_counter() - w0)
t = torch.tensor([sum(cpu[m]) for m in modes], dtype=torch.float64)
dist.all_reduce(t)
if rank == 0:
    k = iters // 2
    print(
        f"ring budget: CPU ms/call (4 ranks) 4MB {t[0] / k * 1e3:.1f}, "
        f"{big >> 20}MB {t[1] / k * 1e3:.1f}, ratio {t[1] / t[0]:.3f}; rank0 median wall "
        f"{np.median(wall[modes[0]]) * 1e3:.1f} / {np.median(wall[modes[1]]) * 1e3:.1f}"
    )
    for (b, backlog), c in sorted(ends.items()):
        print(f"  budget {b >> 20}MB backlog={backlog}: {c / k:.1f} calls per ring call")
endpoint.close()
