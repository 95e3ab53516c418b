"""Rank 0's I/O-thread turns per 25 MB ring all-reduce call, by what each turn had
to do (as ../../receive_linger/turns.py), and how the C receive loop's calls ended
(no linger asked, the trickle rule, the budget, the linger's end, another file
ready): needs a build with epoll_pwait2.diff applied, whose _udpio.trial_reasons()
counts those ends. Run under dlcp.launch (4 ranks):

    TRIAL_PWAIT2=1 [TRIAL_KEEP_LINGER=1] python -c "import sys; from dlcp.launch import launch;
        launch([sys.executable, 'turns_by_end.py', '30', '6250000', '0.05'], 4, timeout=600)"

TRIAL_KEEP_LINGER needs keep_linger.diff too. Arguments: measured calls, float32
elements, the ring's p."""

import collections
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np
import torch.distributed as dist

import dlcp.io.io_loop as io_loop
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.io import _udpio
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
turns: list[tuple[str, float]] = []
measuring = threading.Event()
last_wait = [0.0]
take_input = io_loop.IOLoop._take_input
select = io_loop.ReadSelector.select


def timed_select(self: Any, timeout: float | None = None) -> Any:
    start = time.monotonic()
    try:
        return select(self, timeout)
    finally:
        last_wait[0] = time.monotonic() - start


def sorted_turn(self: Any, sel: Any, ready: Any, timer: Any, now: float, *rest: Any) -> float:
    if not measuring.is_set():
        return take_input(self, sel, ready, timer, now, *rest)
    other = ",".join(sorted(k.data for k, _ in ready if k.data != "data"))
    events = len(self._session.events)
    end = take_input(self, sel, ready, timer, now, *rest)
    kind = "data" if self._delivered else "no data"
    kind += f" + {other}" if other else ""
    kind += " + timer" if timer is not None and timer <= now else ""
    kind += " + events" if len(self._session.events) > events else ""
    turns.append((kind, last_wait[0]))
    return end


io_loop.IOLoop._take_input = sorted_turn  # type: ignore[method-assign]
io_loop.ReadSelector.select = timed_select  # type: ignore[method-assign]
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="turns")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
dist.barrier()
r0 = _udpio.trial_reasons()
if rank == 0:
    measuring.set()
start = time.monotonic()
for _ in range(iters):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
took = time.monotonic() - start
r1 = _udpio.trial_reasons()
if rank == 0:
    ends = [round((b - a) / iters, 1) for a, b in zip(r0, r1, strict=True)]
    print("ends per call: no-linger, trickle, budget, timeout, others:", ends)
measuring.clear()
dist.barrier()
if rank == 0:
    print(
        f"linger {endpoint.config.receive_linger * 1e6:.0f} us: {took / iters * 1e3:.1f} ms "
        f"a call, {len(turns) / iters:.1f} turns a call"
    )
    waits: dict[str, list[float]] = collections.defaultdict(list)
    for kind, wait in turns:
        waits[kind].append(wait * 1e6)
    for kind, ws in sorted(waits.items(), key=lambda kv: -len(kv[1]))[:8]:
        print(
            f"{len(ws) / iters:6.1f}  {kind:32s} select waited {statistics.median(ws):.0f} us "
            "(median)"
        )
endpoint.close()
