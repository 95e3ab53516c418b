"""One rank of a 4-rank job (under dlcp.launch) that runs halving-doubling (``hd``) or
ring (``ring``) all-reduces of ELEMENTS float32 on the loopback; rank 0 prints the
time per call, its pacers' rates towards each peer at the end, how many RATE reports
it took from each peer with and without the SHARED flag, and the last twelve.

    python -c "import sys; from dlcp.launch import launch;
        launch([sys.executable, 'pacer_rates.py', 'hd', '40', '38282'], 4, timeout=300)"
"""

import collections
import sys
import time

import numpy as np
import torch.distributed as dist

import dlcp.proto.outbox as outbox
from dlcp.collectives import Communicator
from dlcp.collectives.halving import halving_doubling_allreduce
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

which, iters, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
reports: list[tuple[int, float, bool]] = []
on_feedback = outbox.Outbox.on_feedback


def noted(self, feedback, **kwargs):
    reports.append((feedback.src, round(feedback.bytes_per_s / 1e6, 2), feedback.shared))
    return on_feedback(self, feedback, **kwargs)


outbox.Outbox.on_feedback = noted
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="pacer-rates")
comm = Communicator(endpoint, job.world_size, channel=1)
allreduce = halving_doubling_allreduce if which == "hd" else ring_allreduce
for _ in range(5):
    allreduce(comm, data.copy(), p=0.05, average=True)
dist.barrier()
start = time.perf_counter()
for _ in range(iters):
    allreduce(comm, data.copy(), p=0.05, average=True)
per_call = (time.perf_counter() - start) / iters
dist.barrier()
if rank == 0:
    print(f"{which}: {per_call * 1e3:.2f} ms a call")
    for peer, state in endpoint._session._outbox.peers.items():
        pacer = state.pacer
        print(f"  to rank {peer}: pacer at {pacer.rate / 1e6:.2f} MB/s, burst {pacer.burst} B")
    counts = collections.Counter((src, shared) for src, _, shared in reports)
    print("  RATE reports (peer, shared):", dict(counts))
    print("  the last twelve (peer, MB/s, shared):", reports[-12:])
endpoint.close()
