"""Receiving a reduction into scratch and adding it afterwards, against receiving it
straight into its sum (``Endpoint.recv(accumulate=True)``), in alternate calls of
one job: the process CPU of every thread per call, summed over the ranks; rank 0's
median wall time per call; and the peak of what numpy allocated during a call on
rank 0 (tracemalloc), with what the communicator keeps as scratch afterwards.

Needs the trial switch of ``trial_switch.diff`` (in this folder) applied: with
``TRIAL_SCRATCH`` set, the ring and the co-located server take the scratch path.
Run under dlcp.launch, 4 ranks on loopback:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ab_calls.py', 'ring', '100', '6250000', '0.05'], 4, timeout=600)"

(``ps`` instead of ``ring``: ps_allreduce, every rank a worker and a server.)"""

import os
import sys
import time
import tracemalloc

import numpy as np
import torch
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ps import ps_allreduce
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

op, iters, n, p = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="ab")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]


def call() -> None:
    if op == "ring":
        ring_allreduce(comm, data, segments=segments, p=p, average=True)
    else:
        ps_allreduce(comm, data, segments=segments, p_push=p, average=True)


for _ in range(4):
    call()
modes = ("scratch", "accumulate")
cpu: dict[str, list[float]] = {m: [] for m in modes}
wall: dict[str, list[float]] = {m: [] for m in modes}
peak: dict[str, list[int]] = {m: [] for m in modes}
tracemalloc.start()
for i in range(iters):
    mode = modes[i % 2]
    if mode == "scratch":
        os.environ["TRIAL_SCRATCH"] = "1"
    else:
        os.environ.pop("TRIAL_SCRATCH", None)
    dist.barrier()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    c0, w0 = time.process_time(), time.perf_counter()
    call()
    dist.barrier()
    cpu[mode].append(time.process_time() - c0)
    wall[mode].append(time.perf_counter() - w0)
    peak[mode].append(tracemalloc.get_traced_memory()[1] - base)
t = torch.tensor([sum(cpu[m]) for m in modes], dtype=torch.float64)
dist.all_reduce(t)
if rank == 0:
    k = iters // 2
    kept = sum(len(b) for b in comm._scratch)
    print(
        f"{op}: CPU ms per call (4 ranks): scratch {t[0] / k * 1e3:.1f}, accumulate "
        f"{t[1] / k * 1e3:.1f}, ratio {t[1] / t[0]:.3f}; rank 0 median wall ms: scratch "
        f"{np.median(wall['scratch']) * 1e3:.1f}, accumulate "
        f"{np.median(wall['accumulate']) * 1e3:.1f}; rank 0 median peak MB allocated in "
        f"a call: scratch {np.median(peak['scratch']) / 1e6:.1f}, accumulate "
        f"{np.median(peak['accumulate']) / 1e6:.1f}; scratch kept {kept / 1e6:.1f} MB"
    )
endpoint.close()
