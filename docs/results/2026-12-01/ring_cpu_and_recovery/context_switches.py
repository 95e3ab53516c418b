"""Voluntary and involuntary context switches per call of the 25 MB ring or of its UDP
floor, per kind of thread, summed over the 4 ranks (/proc/self/task/*/status). Under
dlcp.launch:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'context_switches.py', 'ring', '40', '6250000', '0.05'], 4, timeout=600)"
"""

import os
import sys
from pathlib import Path

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
endpoint, job = connect(group="cs")
comm = Communicator(endpoint, job.world_size, channel=1)
floor, why = _floor(rank, job.world_size)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
call = (
    (lambda: ring_allreduce(comm, data, segments=segments, p=p, average=True))
    if kind == "ring"
    else (lambda: floor.allreduce(data))
)


def snap():
    out = {}
    for t in Path("/proc/self/task").iterdir():
        try:
            name = (t / "comm").read_text().strip()
            st = dict(
                line.split(":\t")
                for line in (t / "status").read_text().splitlines()
                if "ctxt" in line
            )
        except OSError:
            continue
        if name.startswith("python"):
            name = "main" if t.name == str(os.getpid()) else "py-other"
        k = "-".join(name.split("-")[:2])
        v = out.setdefault(k, [0, 0])
        v[0] += int(st["voluntary_ctxt_switches"])
        v[1] += int(st["nonvoluntary_ctxt_switches"])
    return out


for _ in range(3):
    call()
dist.barrier()
a = snap()
for _ in range(iters):
    call()
b = snap()
res = {k: [(b[k][i] - a.get(k, [0, 0])[i]) / iters for i in (0, 1)] for k in b}
g = [None] * job.world_size
dist.all_gather_object(g, res)
if rank == 0:
    tot = {}
    for r in g:
        for k, (v, nv) in r.items():
            t = tot.setdefault(k, [0, 0])
            t[0] += v
            t[1] += nv
    print(kind, {k: (round(v), round(nv)) for k, (v, nv) in tot.items() if v + nv >= 1})
floor.close()
endpoint.close()
