"""Each received message's timeline in the 25 MB ring (``advance_finish_and_timeline.diff``
applied: its receiver marks the times), with the advance FINISH off (A) or on (B) for
the whole job: medians and 90th percentiles of open -> FINISH applied -> NACK queued ->
first retransmitted datagram landed -> completion. Under dlcp.launch, with emulated loss:

    DLCP_EMULATED_LOSS=0.01 DLCP_NATIVE_RECEIVE=0 python -c "import sys; from dlcp.launch
        import launch; launch([sys.executable, 'timeline.py', 'A', '20'], 4, timeout=600)"

or in a lossy namespace: ``python netns_run.py timeline.py A 20``."""

import sys
import time

import numpy as np
import torch.distributed as dist

import dlcp.proto.inbox as ib
import dlcp.proto.outbox as ob
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

mode, iters, n, p = sys.argv[1], int(sys.argv[2]), 6250000, 0.05
ob._TRIAL_ADV[0] = mode == "B"
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="tl")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
ib.TL.clear()
walls = []
for _ in range(iters):
    w = time.perf_counter()
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
    walls.append(time.perf_counter() - w)
d = {k: v for k, v in ib.TL.items() if "done" in v and "open" in v}


def med(a, b):
    xs = [v[b] - v[a] for v in d.values() if a in v and b in v]
    return (
        len(xs),
        round(np.median(xs) * 1e3, 2) if xs else None,
        round(np.percentile(xs, 90) * 1e3, 2) if xs else None,
    )


nacked = {k: v for k, v in d.items() if "nack" in v}
print(
    mode,
    rank,
    "wall med",
    round(np.median(walls) * 1e3, 1),
    "msgs",
    len(d),
    "nacked",
    len(nacked),
    "open->done",
    med("open", "done"),
    "open->fin",
    med("open", "finish_applied"),
    "fin->nack",
    med("finish_applied", "nack"),
    "nack->retx",
    med("nack", "retx"),
    "retx->done",
    med("retx", "done"),
    flush=True,
)
endpoint.close()
