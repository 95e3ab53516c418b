"""Wall and CPU time of the pacer calls an endpoint's I/O thread makes
(``Outbox.on_feedback``, and ``Outbox._round_lost``, which calls ``on_loss``), per
25 MB ring all-reduce call on each rank. Run under dlcp.launch:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'pacer_wait.py', '30', '6250000', '0.05'], 4, timeout=600)"
"""

import collections
import sys
import threading
import time
from typing import Any

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.proto import outbox
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
measuring = threading.Event()
wall: dict[str, list[float]] = collections.defaultdict(list)
cpu: collections.Counter[str] = collections.Counter()


def timed(name: str) -> None:
    original = getattr(outbox.Outbox, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not measuring.is_set():
            return original(*args, **kwargs)
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            wall[name].append(time.perf_counter() - start)
            cpu[name] += time.thread_time() - start_cpu

    setattr(outbox.Outbox, name, wrapped)


timed("on_feedback")
timed("_round_lost")
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="pacer-wait")
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
for name, times in wall.items():
    us = np.array(times) * 1e6
    print(
        f"rank {rank} {name}: {len(us) / iters:.1f}/call wall median {np.median(us):.0f} us "
        f"p90 {np.percentile(us, 90):.0f} max {us.max():.0f} sum/call "
        f"{us.sum() / iters / 1e3:.2f} ms; cpu sum/call {cpu[name] * 1e3 / iters:.2f} ms"
    )
endpoint.close()
