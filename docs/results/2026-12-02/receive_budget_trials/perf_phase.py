"""Ring (or UDP floor) calls only, with perf enabled around them through its control
fifos (rank 0 writes "enable"/"disable" to /tmp/s/ctl and reads perf's answer on
/tmp/s/ack; make both with mkfifo first):

    perf record -a -F 1999 -D -1 --control fifo:/tmp/s/ctl,/tmp/s/ack -o perf_ring.data --
        python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'perf_phase.py', 'ring', '30', '6250000', '0.05'], 4, timeout=900)"

then ``perf script -F comm,tid,ip,sym,dso`` summed by thread name and shared object."""

import sys

import numpy as np
import torch.distributed as dist

from dlcp.bench.allreduce import _floor
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

kind, iters, n, p = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="phase")
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


def ctl(word):
    if rank == 0:
        with open("/tmp/s/ctl", "w") as f:
            f.write(word + "\n")
        with open("/tmp/s/ack") as f:
            f.readline()


dist.barrier()
ctl("enable")
dist.barrier()
for _ in range(iters):
    call()
dist.barrier()
ctl("disable")
dist.barrier()
endpoint.close()
