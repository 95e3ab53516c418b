"""25 MB ring all-reduces on a rank (dlcp.launch, 4 ranks): LOOPSTART once warmed up
(prof.sh starts perf then), then each rank's wall, process CPU and I/O-thread CPU
per call (../io_turn_e519cb9/ring_iocpu.py with the mark)."""

import os
import time

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

N_CALLS = int(os.environ.get("N_CALLS", "30"))
ELEMS = int(os.environ.get("ELEMS", "6250000"))
dist.init_process_group("gloo")
endpoint, job = connect(group="prof")
comm = Communicator(endpoint, job.world_size, channel=1)
data = np.random.default_rng(job.rank).standard_normal(ELEMS).astype(np.float32)
half = ELEMS // 2
segments = [(0, half, 0), (half, ELEMS - half, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=0.05, average=True)
dist.barrier()
print("LOOPSTART", flush=True)
clock = time.pthread_getcpuclockid(endpoint._thread.ident)
turns0 = endpoint.stats()["receive_calls"]
c0 = time.process_time()
t0 = time.perf_counter()
io0 = time.clock_gettime(clock)
for _ in range(N_CALLS):
    ring_allreduce(comm, data, segments=segments, p=0.05, average=True)
io1 = time.clock_gettime(clock)
t1 = time.perf_counter()
c1 = time.process_time()
turns = (endpoint.stats()["receive_calls"] - turns0) / N_CALLS
dist.barrier()
print(
    f"rank {job.rank} wall {1e3 * (t1 - t0) / N_CALLS:.1f} ms/call, "
    f"process cpu {1e3 * (c1 - c0) / N_CALLS:.1f} ms/call, "
    f"io thread cpu {1e3 * (io1 - io0) / N_CALLS:.2f} ms/call, turns {turns:.1f}",
    flush=True,
)
endpoint.close()
dist.destroy_process_group()
