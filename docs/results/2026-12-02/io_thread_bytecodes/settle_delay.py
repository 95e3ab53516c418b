"""Rank 0 of the 25 MB ring: the time from each received message's completion
(Inbox._check_complete queues its MessageReceived) to its receive future's
settlement (Transfers.complete_recv); rank 0's wall time and the four ranks' CPU a
call. TRIAL_END_AT_COMPLETION=1 switches trial_end_call_at_completion.diff on.

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'settle_delay.py', '40', '6250000', '0.05'], 4, timeout=600)"
"""

import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import dlcp.collectives.ring as ring
import dlcp.io.transfers as transfers
import dlcp.proto.inbox as inbox
from dlcp.collectives import Communicator
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
done_at = {}
delays = []
measuring = [False]
orig_check = inbox.Inbox._check_complete


def check(self, key, state, *, now):
    was = key in self._incoming
    orig_check(self, key, state, now=now)
    if was and key not in self._incoming and measuring[0]:
        done_at[key] = time.monotonic()


inbox.Inbox._check_complete = check
orig_complete = transfers.Transfers.complete_recv


def complete(self, fut, ev, out):
    t = done_at.pop((ev.src, ev.step, ev.msg), None)
    if t is not None:
        delays.append(time.monotonic() - t)
    return orig_complete(self, fut, ev, out)


transfers.Transfers.complete_recv = complete
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="settle")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
dist.barrier()
measuring[0] = True
w0, c0 = time.monotonic(), time.process_time()
for _ in range(iters):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
w1, c1 = time.monotonic(), time.process_time()
measuring[0] = False
cpu = torch.tensor([c1 - c0], dtype=torch.float64)
dist.all_reduce(cpu)
dist.barrier()
if rank == 0:
    d = np.array(delays) * 1e3
    spread = f"median {np.median(d):.3f} p90 {np.percentile(d, 90):.3f} max {d.max():.3f}"
    wall = 1e3 * (w1 - w0) / iters
    print(
        f"{len(d)} completions; completion -> future settled ms: {spread}; "
        f"mean {d.mean():.3f}; wall/call {wall:.1f} ms; "
        f"all ranks cpu/call {1e3 * cpu.item() / iters:.1f} ms"
    )
endpoint.close()
