"""cProfile of one rank's I/O thread and caller thread over N ring all-reduces."""

import cProfile
import io
import os
import pstats
import time

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.io import io_loop
from dlcp.rendezvous import connect

N_CALLS = int(os.environ.get("N_CALLS", "10"))
ELEMS = int(os.environ.get("ELEMS", "6250000"))
rank = int(os.environ["RANK"])
prof_io = cProfile.Profile()
orig_run = io_loop.IOLoop._run


def run(self):
    """The I/O thread's loop, profiled from its start (the waits in select too)."""
    prof_io.enable()
    try:
        return orig_run(self)
    finally:
        prof_io.disable()


io_loop.IOLoop._run = run
dist.init_process_group("gloo")
endpoint, job = connect(group="prof")
comm = Communicator(endpoint, job.world_size, channel=1)
data = np.random.default_rng(rank).standard_normal(ELEMS).astype(np.float32)
half = ELEMS // 2
segments = [(0, half, 0), (half, ELEMS - half, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=0.05, average=True)
dist.barrier()
prof_io.create_stats()
prof_io.clear()  # reset
prof_call = cProfile.Profile()
c0 = time.process_time()
t0 = time.perf_counter()
prof_call.enable()
for _ in range(N_CALLS):
    ring_allreduce(comm, data, segments=segments, p=0.05, average=True)
prof_call.disable()
t1 = time.perf_counter()
c1 = time.process_time()
dist.barrier()
endpoint.close()
prof_io.dump_stats(f"/tmp/prof/io{rank}.prof")
prof_call.dump_stats(f"/tmp/prof/call{rank}.prof")
if rank == 0:
    for name, p in (("io", prof_io), ("caller", prof_call)):
        s = io.StringIO()
        st = pstats.Stats(p, stream=s)
        total = sum(v[1] for v in st.stats.values())
        print(f"== {name}: {total / N_CALLS:.0f} calls per ring call")
        st.sort_stats(os.environ.get("SORT", "ncalls")).print_stats(
            int(os.environ.get("NTOP", "45"))
        )
        st.print_callers(os.environ.get("CALLERS", "zzzz"))
        print(s.getvalue()[: int(os.environ.get("MAXCH", "9000"))])
    print(
        f"wall {1e3 * (t1 - t0) / N_CALLS:.1f} ms/call, "
        f"process cpu {1e3 * (c1 - c0) / N_CALLS:.1f} ms/call"
    )
dist.destroy_process_group()
