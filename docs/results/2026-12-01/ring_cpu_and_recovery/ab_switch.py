"""A trial switch against the code as it is, in alternate calls of one job: the process
CPU per call (all threads), summed over the 4 ranks, and rank 0's median wall time per
call, for the 25 MB ring. The switch is a module-level list ``_TRIAL`` that the trial's
few lines read (README of this folder); point TRIAL_MODULE at the module that holds it.
Under dlcp.launch:

    TRIAL_MODULE=dlcp.proto.inbox python -c "import sys; from dlcp.launch import launch;
        launch([sys.executable, 'ab_switch.py', '60', '6250000', '0.05'], 4, timeout=600)"
"""

import importlib
import os
import sys
import time

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
trialmod = importlib.import_module(os.environ["TRIAL_MODULE"])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="ab")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]


def setmode(b):
    trialmod._TRIAL[0] = b


cpu = {False: 0.0, True: 0.0}
wall = {False: [], True: []}
for _ in range(4):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
for i in range(2 * iters):
    b = bool(i % 2)
    setmode(b)
    dist.barrier()
    t0 = time.process_time()
    w0 = time.perf_counter()
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
    w1 = time.perf_counter()
    t1 = time.process_time()
    cpu[b] += t1 - t0
    wall[b].append(w1 - w0)
g = [None] * job.world_size
dist.all_gather_object(g, (cpu[False], cpu[True]))
if rank == 0:
    a = sum(x[0] for x in g) / iters * 1e3
    bb = sum(x[1] for x in g) / iters * 1e3
    print(
        f"A {a:.1f} ms  B {bb:.1f} ms  B/A {bb / a:.3f}  rank0 median wall "
        f"A {np.median(wall[False]) * 1e3:.1f} B {np.median(wall[True]) * 1e3:.1f}"
    )
endpoint.close()
