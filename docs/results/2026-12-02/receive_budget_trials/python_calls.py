"""Python calls per 25 MB ring call on rank 0, by thread and by function (setprofile
on every thread started after it is set: the endpoint's I/O thread is).
    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'python_calls.py', '10', '6250000', '0.05'], 4, timeout=600)"
"""

import collections
import sys
import threading

import numpy as np
import torch.distributed as dist

import dlcp.collectives.ring as ring
from dlcp.collectives import Communicator
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
counts = collections.Counter()
byfn = collections.Counter()
on = [False]


def prof(frame, event, arg):
    if on[0] and event == "call":
        t = threading.current_thread()
        name = (
            "main"
            if t is threading.main_thread()
            else t.name.split("-")[0] + "-" + t.name.split("-")[1]
            if "-" in t.name
            else t.name
        )
        counts[name] += 1
        co = frame.f_code
        byfn[(name, co.co_filename.split("dlcp/")[-1], co.co_name)] += 1


threading.setprofile(prof)
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="callcount")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
sys.setprofile(prof)
dist.barrier()
on[0] = True
for _ in range(iters):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
on[0] = False
dist.barrier()
if rank == 0:
    for k, v in counts.most_common():
        print(f"{v / iters:9.1f} calls/ring call  thread {k}")
    for th in ("main", "dlcp-io"):
        items = [(k, v) for k, v in byfn.items() if k[0] == th]
        items.sort(key=lambda kv: -kv[1])
        print("==", th, len(items), "functions")
        for k, v in items[:70]:
            print(f"{v / iters:9.1f}  {k[1]}:{k[2]}")
endpoint.close()
