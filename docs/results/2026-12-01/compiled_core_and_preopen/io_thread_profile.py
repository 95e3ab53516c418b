"""cProfile (thread CPU clock) of rank 0's I/O thread turns over the 25 MB ring
all-reduce, written to io_thread_profile.txt. With ``TRIAL=1`` and
``preopen_trial.diff`` applied, receives posted before their data open their
message at once. Under dlcp.launch:

    TRIAL=1 python -c "import sys; from dlcp.launch import launch;
        launch([sys.executable, 'io_thread_profile.py', '20', '6250000'], 4, timeout=600)"
"""

import cProfile
import io
import os
import pstats
import sys
import threading
import time

import numpy as np
import torch.distributed as dist

import dlcp.proto.inbox as inbox
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.io.io_loop import IOLoop
from dlcp.rendezvous import connect

if hasattr(inbox, "_TRIAL"):
    inbox._TRIAL[0] = os.environ.get("TRIAL") == "1"
iters, n = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
prof = cProfile.Profile(time.thread_time)
measuring = threading.Event()


def profiled(original):
    def turn_part(self, *args, **kwargs):
        if not (measuring.is_set() and rank == 0):
            return original(self, *args, **kwargs)
        prof.enable()
        try:
            return original(self, *args, **kwargs)
        finally:
            prof.disable()

    return turn_part


IOLoop._take_input = profiled(IOLoop._take_input)
IOLoop._send_and_settle = profiled(IOLoop._send_and_settle)
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="io-thread-profile")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=0.0, average=True)
dist.barrier()
measuring.set()
for _ in range(iters):
    ring_allreduce(comm, data, segments=segments, p=0.0, average=True)
measuring.clear()
dist.barrier()
if rank == 0:
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(60)
    with open("io_thread_profile.txt", "w") as f:
        f.write(out.getvalue())
endpoint.close()
