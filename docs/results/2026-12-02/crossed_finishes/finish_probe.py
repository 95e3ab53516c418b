"""Where a receiver's FINISHes find their message when its inbox reads them: under
way (``live``), ended (``crossed``: the data alone completed it, the STOP is on
its way) or not yet seen (``orphan``), with the endpoint's control counters; in
the 25 MB ring all-reduce, 4 ranks on the loopback, ``p = 0.05``.

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'finish_probe.py', '6250000', '30'], 4, timeout=600)"
"""

import sys

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.proto import inbox as inbox_module
from dlcp.rendezvous import connect

counts = {"finish": 0, "crossed": 0, "live": 0, "orphan": 0}
on_finish = inbox_module.Inbox.on_finish


def counted_on_finish(self, key, finish, *, now):  # type: ignore[no-untyped-def]
    counts["finish"] += 1
    if key in self._ended:
        counts["crossed"] += 1
    elif key in self._incoming:
        counts["live"] += 1
    else:
        counts["orphan"] += 1
    return on_finish(self, key, finish, now=now)


inbox_module.Inbox.on_finish = counted_on_finish  # type: ignore[method-assign]
n, iters = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="probe")
comm = Communicator(endpoint, job.world_size, channel=1)
for _ in range(iters):
    ring_allreduce(comm, data, segments=[(0, n, 0)], p=0.05, average=True)
dist.barrier()
control = {k: v for k, v in endpoint.stats().items() if k.startswith("control_")}
print("rank", rank, counts, control)
endpoint.close()
