"""How long after the native engine decided a round's last batch the I/O thread
reaped the round (and so queued its FINISH), per rank, over 25 MB ring all-reduce
calls. Run under dlcp.launch, as loss_ring.py is:

    DLCP_EMULATED_LOSS=0.01 DLCP_NATIVE_RECEIVE=0 python -c "import sys;
        from dlcp.launch import launch; launch([sys.executable, 'finish_hop.py', '15',
        '6250000', '0.05'], 4, timeout=600)"
"""

import sys
import threading
import time
from typing import Any

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.io import io_loop
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
measuring = threading.Event()
hops: list[float] = []
round_ended = io_loop.IOLoop._round_ended


def timed(self: Any, report: Any) -> None:
    if measuring.is_set() and report.error is None:
        hops.append(time.monotonic() - report.last[0])
    round_ended(self, report)


io_loop.IOLoop._round_ended = timed  # type: ignore[method-assign]
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="finish-hop")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
dist.barrier()
measuring.set()
for _ in range(iters):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
measuring.clear()
dist.barrier()
ms = np.array(hops) * 1e3
print(
    f"rank {rank}: {len(ms) / iters:.1f} rounds reaped a call; last batch decided -> round "
    f"reaped: median {np.median(ms):.2f} ms, p90 {np.percentile(ms, 90):.2f}, max {ms.max():.2f}"
)
endpoint.close()
