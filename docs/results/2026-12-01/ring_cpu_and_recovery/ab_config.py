"""An endpoint setting against the default, in alternate calls of one job: each rank
makes two endpoints, the second with the EndpointConfig fields of the JSON in the last
argument (ProtocolConfig fields under "protocol"); process CPU per call summed over the
4 ranks, rank 0's median wall time per call, 25 MB ring. Under dlcp.launch:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ab_config.py', '60', '6250000', '0.05', sys.argv[1]], 4, timeout=600)" \
        '{"protocol": {"pacer": "unpaced"}}'
"""

import dataclasses
import json
import sys
import time

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.io.config import EndpointConfig
from dlcp.rendezvous import connect

iters, n, p, var = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
base = EndpointConfig.from_env()
proto = var.pop("protocol", {})
cfg_b = dataclasses.replace(base, protocol=dataclasses.replace(base.protocol, **proto), **var)
ea, job = connect(group="a", config=base)
eb, _ = connect(group="b", config=cfg_b)
comms = {
    False: Communicator(ea, job.world_size, channel=1),
    True: Communicator(eb, job.world_size, channel=1),
}
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
cpu = {False: 0.0, True: 0.0}
wall = {False: [], True: []}
for b in (False, True):
    for _ in range(3):
        ring_allreduce(comms[b], data, segments=segments, p=p, average=True)
for i in range(2 * iters):
    b = bool(i % 2)
    dist.barrier()
    t0 = time.process_time()
    w0 = time.perf_counter()
    ring_allreduce(comms[b], data, segments=segments, p=p, average=True)
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
        f"{sys.argv[4]}: A {a:.1f} ms  B {bb:.1f} ms  B/A {bb / a:.3f}  rank0 median wall "
        f"A {np.median(wall[False]) * 1e3:.1f} B {np.median(wall[True]) * 1e3:.1f}"
    )
ea.close()
eb.close()
