"""Thread CPU time of the core benchmark's work, by session call and C kernel.

    python cpu_by_call.py [transfers]     # default 20, after one warm-up transfer

The sessions and data of ``python -m dlcp.bench.core`` (64 MiB of float32, the
native engine's path: whole rounds, the tensor lent), with each call below timed
by ``time.thread_time`` (CPU time of this thread: time the machine's other jobs
take from it is left out, which wall time on a busy machine is not). Nested
calls are each counted in full: ``send_message`` includes ``plan_message``, which
includes the C ``block_abs_mean_f32``. Prints milliseconds per transfer.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import dlcp.bench.core as core
from dlcp.proto import kernels, outbox, packetizer
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import Session

spent: collections.defaultdict[str, float] = collections.defaultdict(float)


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.thread_time() - start

    return call


def main() -> int:
    transfers = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    for name in ("send_message", "datagrams_to_send", "receive_batch", "receive_datagram"):
        setattr(Session, name, timed(name, getattr(Session, name)))
    outbox.plan_message = timed("plan_message", outbox.plan_message)
    outbox.build_records = timed("build_records", outbox.build_records)
    packetizer._magnitudes_of = timed("magnitudes", packetizer._magnitudes_of)
    accel: Any = kernels._accel
    for name in ("scatter_run", "block_abs_mean_f32", "gather_records"):
        setattr(accel, name, timed("C " + name, getattr(accel, name)))

    data = np.random.default_rng(0).standard_normal(16 << 20).astype(np.float32)
    out = np.empty_like(data)
    config = ProtocolConfig(pacer="unpaced")
    tx = Session(rank=0, job=1, config=config, whole_rounds=True)
    rx = Session(rank=1, job=1, config=config)
    core.one_transfer(tx, rx, data, out, step=0)  # warm-up
    spent.clear()
    for step in range(1, transfers + 1):
        out[...] = 0
        core.one_transfer(tx, rx, data, out, step=step)
    for name, seconds in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"{name:22} {seconds / transfers * 1e3:6.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
