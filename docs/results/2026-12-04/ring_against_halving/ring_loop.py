"""ITERS calls of the ring (KIND=ring) or of halving-doubling (KIND=hd) after 3
warm-up calls, for ``perf record -a`` to sample:

    perf record -q -F 1999 -a -o perf_KIND.data -- python -c "import sys; from
        dlcp.launch import launch; launch([sys.executable, 'ring_loop.py', '100',
        '6250000', '0.05', 'KIND'], 4, timeout=600)"
    perf report -i perf_KIND.data --sort comm,dso -q --stdio -n
"""

import sys

import numpy as np
import torch.distributed as dist

import dlcp.collectives.ring as ring
from dlcp.collectives import Communicator, halving_doubling_allreduce
from dlcp.rendezvous import connect

iters, n, p, kind = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo")
data = np.random.default_rng(dist.get_rank()).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="perf")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
f = ring.ring_allreduce if kind == "ring" else halving_doubling_allreduce
for _ in range(3):
    f(comm, data, segments=segments, p=p, average=True)
dist.barrier()
for _ in range(iters):
    f(comm, data, segments=segments, p=p, average=True)
dist.barrier()
endpoint.close()
