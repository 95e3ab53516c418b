"""Halving-doubling's counterpart of ``../send_plan_in_one_call/ring_general.py``.
Which data datagrams of a 25 MB call take the general path (the receive table
hands them to Session.receive_batch), on every rank, by the message's role in its
call, whether it is the message's first chunk, its bound, its length, and what the
receiver knew of the message: open, expected (a posted receive), ended or unknown.

    DLCP_FINISH_TIMEOUT=5 python -c "import sys; from dlcp.launch import launch;
        launch([sys.executable, 'hd_general.py', '6', '6250000', '0.05'], 4, timeout=300)"
"""

import collections
import sys

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator, halving_doubling_allreduce
from dlcp.proto import session as session_mod
from dlcp.proto.wire import DATA_HEADER_LEN, HEADER_DTYPE
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
seen = collections.Counter()
on = [False]
orig = session_mod.Session.receive_batch


def wrapped(self, buf, segment_size, *, now):
    if on[0]:
        nseg = -(-len(buf) // segment_size)
        for i in range(nseg):
            d = buf[i * segment_size : (i + 1) * segment_size]
            if len(d) < DATA_HEADER_LEN:
                seen["short"] += 1
                continue
            h = d[:DATA_HEADER_LEN].view(HEADER_DTYPE)[0]
            key = (int(h["src"]), int(h["step"]), int(h["msg"]))
            ib = self._inbox
            known = (
                "open"
                if key in ib._incoming
                else "expected"
                if key in ib._expected
                else "ended"
                if key in ib._ended
                else "unknown"
            )
            role = int(h["msg"]) & 0xFFF  # (the message's role in its call: dlcp.collectives.comm)
            seen[
                (
                    f"role {role}",
                    f"first chunk {int(h['seq']) == 0}",
                    f"bound {int(h['bound'])}",
                    f"{len(d)} bytes",
                    known,
                )
            ] += 1
    return orig(self, buf, segment_size, now=now)


session_mod.Session.receive_batch = wrapped
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="general")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    halving_doubling_allreduce(comm, data, segments=segments, p=p, average=True)
dist.barrier()
on[0] = True
for _ in range(iters):
    halving_doubling_allreduce(comm, data, segments=segments, p=p, average=True)
on[0] = False
dist.barrier()
print(rank, "per call:", {k: v / iters for k, v in sorted(seen.items(), key=str)})
endpoint.close()
