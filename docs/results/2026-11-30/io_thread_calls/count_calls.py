"""One rank of a 4-rank job (run under dlcp.launch) that calls DLCP's 25 MB ring
all-reduce; rank 0 counts the calls its endpoint's I/O thread makes, Python
functions and C functions called from Python, per all-reduce call.

    python -c "import sys; from dlcp.launch import launch; \\
        launch([sys.executable, 'count_calls.py', '10', '6250000'], 4, timeout=600)"

threading.setprofile is set while rank 0 connects, so the threads its endpoint
starts then carry the profiler; it counts in the I/O thread only (``dlcp-io-*``),
after two warm-up calls. Counts, not times: the profiler slows the thread, so
the turns per call may differ from an unprofiled run's."""

import collections
import sys
import threading
from typing import Any

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

iters, n = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
counts: collections.Counter[str] = collections.Counter()
counting = threading.Event()


def profile(frame: Any, event: str, arg: Any) -> None:
    if not counting.is_set() or event not in ("call", "c_call"):
        return
    if not threading.current_thread().name.startswith("dlcp-io"):
        return
    if event == "call":
        code = frame.f_code
        counts[f"{code.co_filename.split('dlcp/')[-1]}:{code.co_name}"] += 1
    else:
        counts[f"C:{getattr(arg, '__qualname__', arg)}"] += 1


if rank == 0:
    threading.setprofile(profile)
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="count-calls")
threading.setprofile(None)  # (no later thread: only the endpoint's carry it)
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(2):
    ring_allreduce(comm, data, segments=segments, p=0.0, average=True)
dist.barrier()
s0 = endpoint.stats()
counting.set()
for _ in range(iters):
    ring_allreduce(comm, data, segments=segments, p=0.0, average=True)
counting.clear()
s1 = endpoint.stats()
dist.barrier()
if rank == 0:
    turns = (s1["receive_calls"] - s0["receive_calls"]) / iters
    control = (s1["control_in"] - s0["control_in"]) / iters
    total = sum(counts.values()) / iters
    print(
        f"I/O thread calls per all-reduce call: {total:.0f}; receive calls (turns with "
        f"data) per call: {turns:.1f}; control messages in per call: {control:.1f}"
    )
    for name, k in counts.most_common(60):
        print(f"{k / iters:9.1f} {name}")
endpoint.close()
