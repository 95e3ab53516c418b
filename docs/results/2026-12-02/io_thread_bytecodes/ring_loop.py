"""The ring all-reduce in a loop: the four ranks' CPU a call, and rank 0's CPU and
wall time a call. Once warm, rank 0 writes its pid to $PID_FILE (for perf, py-spy).

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ring_loop.py', '120', '6250000', '0.05'], 4, timeout=600)"
"""

import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import dlcp.collectives.ring as ring
from dlcp.collectives import Communicator
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="prof")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
dist.barrier()
if rank == 0:
    with open(os.environ.get("PID_FILE", "/tmp/ring_loop.pid"), "w") as f:
        f.write(str(os.getpid()))
t0 = time.process_time()
w0 = time.monotonic()
for _ in range(iters):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
t1 = time.process_time()
w1 = time.monotonic()
tot = torch.tensor([t1 - t0, w1 - w0], dtype=torch.float64)
dist.all_reduce(tot)
if rank == 0:
    print(f"all ranks cpu/call {1e3 * tot[0].item() / iters:.1f} ms")
    cpu, wall = 1e3 * (t1 - t0) / iters, 1e3 * (w1 - w0) / iters
    print(f"rank0 cpu/call {cpu:.1f} ms wall/call {wall:.1f} ms")
endpoint.close()
