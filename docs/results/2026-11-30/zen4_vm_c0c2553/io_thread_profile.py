"""cProfile of rank 0's I/O thread (its turns' input and their send-and-settle) over
ITERS 25 MB ring all-reduce calls, p = 0.05, two layers. Run under dlcp.launch:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'io_thread_profile.py', '30', '6250000', '0.05'], 4, timeout=600)"

cProfile's times are wall times: a C call that releases the GIL is charged until
the thread has the GIL back."""

import cProfile
import io
import pstats
import sys
import threading

import numpy as np
import torch.distributed as dist

import dlcp.io.io_loop as io_loop
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
prof = cProfile.Profile()
measuring = threading.Event()
orig = io_loop.IOLoop._take_input
orig_send = io_loop.IOLoop._send_and_settle
turns = [0]


def take_input(self, *a):
    if measuring.is_set():
        turns[0] += 1
        prof.enable()
        try:
            return orig(self, *a)
        finally:
            prof.disable()
    return orig(self, *a)


def send_and_settle(self, *a):
    if measuring.is_set():
        prof.enable()
        try:
            return orig_send(self, *a)
        finally:
            prof.disable()
    return orig_send(self, *a)


if rank == 0:
    io_loop.IOLoop._take_input = take_input
    io_loop.IOLoop._send_and_settle = send_and_settle
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="prof")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
dist.barrier()
if rank == 0:
    measuring.set()
for _ in range(iters):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
measuring.clear()
dist.barrier()
if rank == 0:
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    print(f"turns per call {turns[0] / iters:.1f}")
    st.sort_stats("tottime").print_stats(30)
    print(s.getvalue())
    s2 = io.StringIO()
    pstats.Stats(prof, stream=s2).sort_stats("cumulative").print_stats(40)
    print(s2.getvalue())
