"""Per 25 MB ring all-reduce call on each rank: the control messages the session
queued (by type, and how often one flush had two or more for the same peer), and
the cyclic garbage collector's collections and CPU. Run under dlcp.launch:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'control_and_gc.py', '20', '6250000', '0.05'], 4, timeout=600)"
"""

import collections
import gc
import sys
import threading
import time
from typing import Any

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.proto import session
from dlcp.proto.events import ControlDatagram
from dlcp.proto.wire import PacketType
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
measuring = threading.Event()
kinds: collections.Counter[str] = collections.Counter()
same_peer: collections.Counter[int] = collections.Counter()  # control items per (flush, peer)
collected = {"cpu": 0.0, "collections": 0}
started = {"at": 0.0}
queued = session.Session.datagrams_to_send


def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
    items = queued(self, *args, **kwargs)
    control = [i for i in items if type(i) is ControlDatagram]
    if measuring.is_set() and control:
        for count in collections.Counter(i.dst for i in control).values():
            same_peer[count] += 1
        for item in control:
            kinds[PacketType(item.data[0] & 0x0F).name] += 1
    return items


def on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        started["at"] = time.thread_time()
    elif measuring.is_set():
        collected["cpu"] += time.thread_time() - started["at"]
        collected["collections"] += 1


session.Session.datagrams_to_send = counting  # type: ignore[method-assign]
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="control-and-gc")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
gc.callbacks.append(on_gc)
dist.barrier()
measuring.set()
for _ in range(iters):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
measuring.clear()
dist.barrier()
print(
    f"rank {rank}: control queued per call {({k: v / iters for k, v in kinds.items()})}; "
    f"(flush, peer) groups by size {({k: v / iters for k, v in sorted(same_peer.items())})}; "
    f"gc: {collected['collections'] / iters:.2f} collections, "
    f"{collected['cpu'] * 1e3 / iters:.3f} ms CPU per call"
)
endpoint.close()
