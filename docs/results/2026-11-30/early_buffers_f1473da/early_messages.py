"""Rank 0's messages per 25 MB ring all-reduce call by where their data first
went: into the receive's buffer (posted first), or into a buffer of the message's
own (it came, or completed, before its receive was posted), and of those how many
started in a buffer kept from an earlier early message. Also counts the buffers
given back to the inbox's pool (float32 rows: the message buffers, not the send
side's record buffers). Run under dlcp.launch (4 ranks):

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'early_messages.py', '30', '6250000', '0.05'], 4, timeout=600)"

Arguments: measured calls, float32 elements, the ring's p."""

import sys
import threading
from typing import Any

import numpy as np
import torch.distributed as dist

import dlcp.proto.buffer_pool as buffer_pool
import dlcp.proto.reassembler as reassembler
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
counts = {"own": 0, "posted": 0, "kept": 0, "given_back": 0}
measuring = threading.Event()
reassembler_init = reassembler.Reassembler.__init__
pool_give = buffer_pool.BufferPool.give


def counting_init(self: Any, *, out: Any, **kw: Any) -> None:
    if measuring.is_set():
        counts["own" if out is None else "posted"] += 1
        counts["kept"] += kw.get("spare") is not None
    reassembler_init(self, out=out, **kw)


def counting_give(self: Any, buf: Any) -> None:
    if measuring.is_set():
        counts["given_back"] += buf.shape[1] == 4
    pool_give(self, buf)


reassembler.Reassembler.__init__ = counting_init  # type: ignore[method-assign]
buffer_pool.BufferPool.give = counting_give  # type: ignore[method-assign]
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="early")
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
print(f"rank {rank}, per call: " + ", ".join(f"{k} {v / iters:.2f}" for k, v in counts.items()))
