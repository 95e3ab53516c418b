"""The links of a NACK round across ranks (CLOCK_MONOTONIC is one clock for every
process): the receiver queues the NACK -> its I/O thread sends it -> the sender's reads it
-> the sender posts the retransmission round -> its first datagram lands at the receiver.
Needs ``advance_finish_and_timeline.diff``; run as ``timeline.py`` is."""

import sys

import numpy as np
import torch.distributed as dist

import dlcp.proto.inbox as ib
import dlcp.proto.outbox as ob
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

mode, iters, n, p = sys.argv[1], int(sys.argv[2]), 6250000, 0.05
ob._TRIAL_ADV[0] = mode == "B"
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="tl")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
ib.TL.clear()
ob.STL.clear()
for _ in range(iters):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
g = [None] * job.world_size
dist.all_gather_object(g, (rank, dict(ib.TL), dict(ob.STL)))
if rank == 0:
    rows = []
    for r, tl, _ in g:
        for (s, step, msg), t in tl.items():
            st = g[s][2].get((r, step, msg), {})
            if (
                "nack" in t
                and "retx" in t
                and "nack_in" in st
                and "post" in st
                and "nack_sent" in t
            ):
                rows.append(
                    (
                        t["nack_sent"] - t["nack"],
                        st["nack_in"] - t["nack_sent"],
                        st["post"] - st["nack_in"],
                        t["retx"] - st["post"],
                    )
                )
    a = np.array(rows) * 1e3
    print(
        mode,
        len(rows),
        "queued->sent, sent->sender read, read->post, post->retx landed: median",
        np.round(np.median(a, 0), 2),
        "p90",
        np.round(np.percentile(a, 90, 0), 2),
        flush=True,
    )
endpoint.close()
