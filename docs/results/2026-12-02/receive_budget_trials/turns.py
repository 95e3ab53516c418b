"""What ends rank 0's I/O turns in the 25 MB ring, per ring call: the files select saw
ready, callers that woke a linger, receive calls by how they ended (at the budget with
data still queued, a linger to its end or cut short, no linger: another file was
ready), the control connections Python read and the control frames it applied by
type (the STOPs the waits kept among them); with trial_read_on.diff applied,
what its read_on answered and why:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'turns.py', '30', '6250000', '0.05'], 4, timeout=600)"
"""

import collections
import sys
import time
from typing import Any

import numpy as np
import torch.distributed as dist

import dlcp.io.control_input as control_input
import dlcp.io.endpoint as endpoint_module
import dlcp.io.io_loop as io_loop
import dlcp.io.readiness as readiness
import dlcp.io.udp as udp
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
counts: collections.Counter[str] = collections.Counter()
measuring = [False]


def wrap(owner: Any, name: str, count: Any) -> None:
    """``owner.name`` counts through ``count(self, result, *args, **kwargs)`` while measuring."""
    original = getattr(owner, name)

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if measuring[0]:
            count(self, result, *args, **kwargs)
        return result

    setattr(owner, name, wrapped)


def on_select(sel: Any, ready: Any, timeout: float | None = None) -> None:
    counts["selects"] += 1
    kinds = ",".join(sorted(key.data for key, _ in ready))
    counts["ready " + (kinds or "nothing (the timeout)")] += 1


def on_receive(data: Any, read: int, deliver: Any, **kwargs: Any) -> None:
    linger = kwargs.get("linger", 0.0)
    if data.backlog:
        how = "at the budget"
    elif not linger:
        how = "no linger"
    else:
        how = "linger to its end" if data.lingered >= 0.9 * linger else "linger cut short"
    counts["receive call: " + how] += 1


def on_wake(endpoint: Any, result: Any) -> None:
    counts["wake-ups of a linger" if endpoint._lingering else "other wake-ups"] += 1


def on_control_frame(loop: Any, result: Any, peer: int, datagram: bytes, now: float) -> None:
    counts[f"control frame read by Python, type {datagram[0] & 0x0F}"] += 1


def on_read_control(loop: Any, result: Any, *args: Any, **kwargs: Any) -> None:
    counts["control connection read by Python"] += 1


def on_reads_on(loop: Any, answer: bool) -> None:
    session = loop._session
    why = [name for name, held in (("callers", loop._callers), ("junk", loop._junk_read),
           ("events", session.events), ("control queued", session._ctx.control),
           ("outbox may send", session._outbox.may_send),
           ("hold over", time.monotonic() - loop._control_turn >= io_loop._BACKLOG_HOLD))
           if held]  # fmt: skip
    counts[f"read_on {answer}: {','.join(why)}"] += 1


wrap(readiness.ReadSelector, "select", on_select)
wrap(udp.DataSockets, "receive", on_receive)
wrap(endpoint_module.Endpoint, "_wake", on_wake)
wrap(control_input.ControlInput, "_control_frame", on_control_frame)
wrap(control_input.ControlInput, "_read_control", on_read_control)
if hasattr(io_loop.IOLoop, "_reads_on"):  # (trial_read_on.diff)
    wrap(io_loop.IOLoop, "_reads_on", on_reads_on)

data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="turns")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
dist.barrier()
measuring[0] = True
for _ in range(iters):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
measuring[0] = False
dist.barrier()
if rank == 0:
    for what, count in sorted(counts.items()):
        print(f"{count / iters:7.1f}  {what}")
endpoint.close()
