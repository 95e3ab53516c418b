"""Rank 0's CPU per 25 MB ring all-reduce call in one thread, by section: the I/O
thread's turn (``io``) or the calling thread's (``caller``). Run under dlcp.launch:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'sections.py', 'io', '30', '6250000', '0.05'], 4, timeout=600)"

Arguments: the thread, measured calls, float32 elements, the ring's p. Each section
is a function wrapped to add up the thread's CPU clock (time.thread_time) across
its calls in that thread; nested sections are indented. The wrapping adds two
clock reads per call."""

import collections
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist

import dlcp.collectives.ring as ring
import dlcp.io.endpoint as endpoint_module
import dlcp.io.engine as engine
import dlcp.io.io_loop as io_loop
import dlcp.io.readiness as readiness
import dlcp.io.transfers as transfers
import dlcp.io.udp as udp
import dlcp.proto.classify as classify
import dlcp.proto.outbox as outbox
import dlcp.proto.packetizer as packetizer
from dlcp.collectives import Communicator
from dlcp.rendezvous import connect

which, iters, n, p = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
cpu: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()
measuring = threading.Event()


def in_thread() -> bool:
    if which == "io":
        return threading.current_thread().name.startswith("dlcp-io")
    return threading.current_thread() is threading.main_thread()


def wrap(owner: Any, name: str, label: str, by_p: bool = False) -> None:
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not measuring.is_set() or not in_thread():
            return original(*args, **kwargs)
        start = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            key = f"{label} p={kwargs.get('loss_bound')}" if by_p else label
            cpu[key] += time.thread_time() - start
            calls[key] += 1

    setattr(owner, name, wrapped)


if rank == 0 and which == "io":
    wrap(readiness.ReadSelector, "select", "select")
    wrap(io_loop.IOLoop, "_receive_data", "receive data (all)")
    wrap(udp, "hand_over", "  hand_over (Python's part of the receive)")
    wrap(io_loop.IOLoop, "_deliver", "    _deliver (a message's first run, Python run path)")
    wrap(io_loop.IOLoop, "_took", "    _took (what the C table took)")
    wrap(io_loop.IOLoop, "_on_ready", "other input (control, engine, wake)")
    wrap(io_loop.IOLoop, "_read_control", "  _read_control")
    wrap(io_loop.IOLoop, "_rounds_sent", "  _rounds_sent (engine reap, FINISH)")
    wrap(io_loop.IOLoop, "_send_and_settle", "send and settle")
    wrap(io_loop.IOLoop, "_send_control", "  _send_control")
    wrap(transfers.Transfers, "dispatch", "  dispatch (futures)")
elif rank == 0:
    wrap(ring, "exchange", "exchange (send, wait for the receive)")
    wrap(endpoint_module.Endpoint, "send", "Endpoint.send (all)")
    wrap(outbox.Outbox, "send", "  Outbox.send (planning)")
    wrap(outbox, "plan_message", "    plan_message", by_p=True)
    wrap(packetizer, "_magnitudes_of", "      magnitudes")
    wrap(classify.CombinedClassifier, "classify", "      classify")
    if hasattr(packetizer, "classify_chunks"):  # (from e9269da: the rule in one C pass)
        wrap(packetizer, "classify_chunks", "      classify_chunks")
    wrap(outbox, "first_round", "    first_round")
    wrap(io_loop.IOLoop, "_send_and_settle", "  send and settle (the caller's)")
    wrap(engine.NativeSender, "post", "    NativeSender.post")
    wrap(endpoint_module.Endpoint, "recv", "Endpoint.recv (posting)")
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group=f"sections-{which}")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
thread = next(
    t for t in threading.enumerate() if (t.name.startswith("dlcp-io") if which == "io" else
                                         t is threading.main_thread())
)  # fmt: skip
stat = Path(f"/proc/self/task/{thread.native_id}/stat")


def thread_cpu() -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # (clock ticks: 100 a second here)


dist.barrier()
before = thread_cpu()
measuring.set()
for _ in range(iters):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
measuring.clear()
after = thread_cpu()
dist.barrier()
if rank == 0:
    print(f"{which} thread CPU per call {(after - before) * 1e3 / iters:.2f} ms (/proc)")
    for label in cpu:
        print(f"{cpu[label] * 1e3 / iters:8.3f} ms {calls[label] / iters:7.1f} calls  {label}")
endpoint.close()
