"""Where a step of the 25 MB ring all-reduce spends its wall time on rank 0: the
send (the caller planning the message and posting it), the wait for the step's
receive, and the caller's wake-up after the I/O thread completed that receive.
Run under dlcp.launch:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'step_times.py', '30', '6250000', '0.05'], 4, timeout=600)"

Arguments: measured calls, float32 elements, the ring's p. Each exchange is
wrapped: the time its send_part took, the time from then to the receive's
future being done (a done-callback's clock, on the I/O thread), and from that to
the caller running again. Between exchanges the caller adds what it received;
before the first it posts the call's receives, after the last it waits for the
sends' STOPs."""

import statistics
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch.distributed as dist

import dlcp.collectives.ring as ring
from dlcp.collectives import Communicator
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
measuring = threading.Event()
#: per step (0-2 reduce-scatter, 3-5 all-gather): (send, wait until done, wake-up) in ms
steps: dict[int, list[tuple[float, float, float]]] = {}
#: per call: from one exchange's end to the next one's start (the add, in the scatter)
between: list[float] = []
last_end = [0.0]
#: per call: from its start to the first exchange's (posting the receives), and from
#: the last exchange's end to its return (waiting for the sends' STOPs)
first_start = [0.0]
before_first: list[float] = []
after_last: list[float] = []
original_exchange = ring.exchange
original_send_part = Communicator.send_part


def send_part(self: Communicator, *args: Any, **kwargs: Any) -> Any:
    try:
        return original_send_part(self, *args, **kwargs)
    finally:
        sent_at[0] = time.monotonic()


sent_at = [0.0]


def exchange(*args: Any, **kwargs: Any) -> Any:
    if not measuring.is_set():
        return original_exchange(*args, **kwargs)
    incoming: Future[Any] | None = args[3]
    done_at = [0.0]
    if incoming is not None:
        incoming.add_done_callback(lambda _: done_at.__setitem__(0, time.monotonic()))
    start = time.monotonic()
    if last_end[0]:
        between.append((start - last_end[0]) * 1e3)
    else:
        first_start[0] = start
    try:
        return original_exchange(*args, **kwargs)
    finally:
        end = last_end[0] = time.monotonic()
        done = max(done_at[0], sent_at[0])  # (done before the send returned: no wait)
        step = len(steps_in_call)
        steps_in_call.append(0)
        steps.setdefault(step, []).append(
            ((sent_at[0] - start) * 1e3, (done - sent_at[0]) * 1e3, (end - done) * 1e3)
        )


steps_in_call: list[int] = []
ring.exchange = exchange
Communicator.send_part = send_part  # type: ignore[method-assign]
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="step-times")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
dist.barrier()
calls = []
if rank == 0:
    measuring.set()
for _ in range(iters):
    steps_in_call.clear()
    last_end[0] = 0.0
    begin = time.monotonic()
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
    end = time.monotonic()
    calls.append((end - begin) * 1e3)
    if measuring.is_set():
        before_first.append((first_start[0] - begin) * 1e3)
        after_last.append((end - last_end[0]) * 1e3)
measuring.clear()
dist.barrier()
if rank == 0:
    med = statistics.median
    print(f"call: median {med(calls):.1f} ms; before the first exchange {med(before_first):.2f}, "
          f"between exchanges (the add) {med(between):.2f}, after the last "
          f"{med(after_last):.2f}")  # fmt: skip
    print("step  send (plan, post)  wait until done  wake-up   (median ms)")
    for step, rows in sorted(steps.items()):
        send, wait, wake = (med(col) for col in zip(*rows, strict=True))
        print(f"{step:4d}  {send:18.2f}  {wait:15.2f}  {wake:8.2f}")
    # (means per call, which add up to the call's mean)
    sums = [sum(col) / iters for col in zip(*(r for rows in steps.values() for r in rows),
                                          strict=True)]  # fmt: skip
    print(f"per call, means: call {statistics.mean(calls):.1f} ms = sends {sums[0]:.1f} + "
          f"waits {sums[1]:.1f} + wake-ups {sums[2]:.1f} + between exchanges "
          f"{sum(between) / iters:.1f} + before {statistics.mean(before_first):.1f} + "
          f"after {statistics.mean(after_last):.1f}")
endpoint.close()
