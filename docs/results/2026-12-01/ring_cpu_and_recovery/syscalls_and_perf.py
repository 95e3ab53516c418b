"""Only the 25 MB ring or only its UDP floor, for N calls, with rank 0 wrapping the
measured calls in a system-wide `perf trace -s` (TOOL=trace, the default: syscall counts
per thread) or `perf record -a -g` (TOOL=record). As root, under dlcp.launch:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'syscalls_and_perf.py', 'ring', '40', '6250000', '0.05', 'ring.trace'], 4, timeout=600)"

Arguments: ring or floor, calls, float32 elements, the ring's p, perf's output file."""

import os
import signal
import subprocess
import sys

import numpy as np
import torch.distributed as dist

from dlcp.bench.allreduce import _floor
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

kind, iters, n, p, out = (
    sys.argv[1],
    int(sys.argv[2]),
    int(sys.argv[3]),
    float(sys.argv[4]),
    sys.argv[5],
)
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="kind")
comm = Communicator(endpoint, job.world_size, channel=1)
floor, why = _floor(rank, job.world_size)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
call = (
    (lambda: ring_allreduce(comm, data, segments=segments, p=p, average=True))
    if kind == "ring"
    else (lambda: floor.allreduce(data))
)
for _ in range(3):
    call()
dist.barrier()
if rank == 0:
    tool = os.environ.get("TOOL", "trace")
    cmd = (
        ["perf", "trace", "-s", "-a", "-o", out]
        if tool == "trace"
        else ["perf", "record", "-a", "-g", "-o", out]
    )
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    import time

    time.sleep(1.0)  # (perf's start-up: it prints nothing to wait on)
dist.barrier()
for _ in range(iters):
    call()
dist.barrier()
if rank == 0:
    proc.send_signal(signal.SIGINT)
    proc.wait()
floor.close()
endpoint.close()
