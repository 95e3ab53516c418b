"""The UDP floor's ring (dlcp.bench.ddp_floor) on a rank, as ring_mark.py runs
DLCP's: LOOPSTART once warmed up, then wall and process CPU per call."""

import os
import time

import numpy as np
import torch.distributed as dist

from dlcp.bench.allreduce import _floor

N_CALLS = int(os.environ.get("N_CALLS", "200"))
ELEMS = int(os.environ.get("ELEMS", "6250000"))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
floor, why = _floor(rank, world)
assert floor is not None, why
data = np.random.default_rng(rank).standard_normal(ELEMS).astype(np.float32)
for _ in range(3):
    floor.allreduce(data)
dist.barrier()
print("LOOPSTART", flush=True)
c0, t0 = time.process_time(), time.perf_counter()
for _ in range(N_CALLS):
    floor.allreduce(data)
t1, c1 = time.perf_counter(), time.process_time()
dist.barrier()
wall, cpu = 1e3 * (t1 - t0) / N_CALLS, 1e3 * (c1 - c0) / N_CALLS
print(f"rank {rank} wall {wall:.1f} ms/call, process cpu {cpu:.1f} ms/call", flush=True)
floor.close()
