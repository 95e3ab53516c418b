import collections, sys, threading, time
import numpy as np
import torch.distributed as dist
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect
import dlcp.proto.outbox as outbox
iters, n, P = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
on = threading.Event()
wall = collections.defaultdict(list); cpu = collections.Counter()
def wrap(owner, name):
    orig = getattr(owner, name)
    def w(*a, **k):
        if not on.is_set():
            return orig(*a, **k)
        t, c = time.perf_counter(), time.thread_time()
        try:
            return orig(*a, **k)
        finally:
            wall[name].append(time.perf_counter() - t); cpu[name] += time.thread_time() - c
    setattr(owner, name, w)
wrap(outbox.Outbox, "on_feedback"); wrap(outbox.Outbox, "_round_lost")
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="pw")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=P, average=True)
dist.barrier(); on.set()
for _ in range(iters):
    ring_allreduce(comm, data, segments=segments, p=P, average=True)
on.clear(); dist.barrier()
for k, v in wall.items():
    v = np.array(v) * 1e6
    print(f"rank {rank} {k}: {len(v)/iters:.1f}/call wall median {np.median(v):.0f} us p90 {np.percentile(v,90):.0f} max {v.max():.0f} sum/call {v.sum()/iters/1e3:.2f} ms; cpu sum/call {cpu[k]*1e3/iters:.2f} ms")
endpoint.close()
