"""One rank of a 4-rank job (under dlcp.launch) timing small halving-doubling
all-reduces on the loopback, with one of the trials that found what held them
(TRIAL, unset for the code as it is):

* ``c-unpaced``: the native engine's pacers made unpaced, everything else as it is
  (the receivers still meter and report);
* ``min-rate``: the engine's pacers may not go below 1 GB/s (no report can hold
  a sender down);
* ``no-shared``: the receivers' meters never flag a window SHARED (they still
  hear how many senders have messages under way, for the window's length).

Rank 0 prints the time a call, the median and 90th percentile of each step of
the call (the reduce-scatter's roles 0 and 1, the all-gather's 2048 and 2049,
and the final wait for the sends), and the engine pacers' rates at each post.

    python -c "import sys; from dlcp.launch import launch;
        launch([sys.executable, 'hd_trials.py', '60', '38282'], 4, timeout=300)"
"""

import collections
import os
import sys
import time

import numpy as np
import torch.distributed as dist

import dlcp.collectives.halving as halving
import dlcp.collectives.ring as ring
import dlcp.io.engine as engine
import dlcp.proto.rate_meter as rate_meter
from dlcp.collectives import Communicator
from dlcp.rendezvous import connect

trial = os.environ.get("TRIAL", "")
make_pacer = engine._native_pacer
if trial == "c-unpaced":
    engine._native_pacer = lambda **options: make_pacer(unpaced=True)
elif trial == "min-rate":
    engine._native_pacer = lambda **options: make_pacer(**{**options, "min_rate": 1e9})
elif trial == "no-shared":
    rate_meter.RateMeter.senders_under_way = lambda self, n, now=None: setattr(
        self, "_under_way", n
    )
elif trial:
    sys.exit(f"TRIAL={trial!r}: c-unpaced, min-rate or no-shared")

measuring = [False]
step_times: dict[object, list[float]] = collections.defaultdict(list)
post_rates: list[float] = []


def timed(fn, name_of):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        if measuring[0]:
            step_times[name_of(kwargs)].append(time.perf_counter() - t0)
        return result

    return wrapper


halving.exchange = timed(halving.exchange, lambda kwargs: kwargs["role"])
ring.SendTracker.wait = timed(ring.SendTracker.wait, lambda kwargs: "sends")
post = engine.NativeSender.post


def noted_post(self, item, address, *, now):
    if measuring[0] and item.dst in self._pacers:
        post_rates.append(self._pacers[item.dst].rate / 1e6)
    return post(self, item, address, now=now)


engine.NativeSender.post = noted_post

iters, n = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="hd-trials")
comm = Communicator(endpoint, job.world_size, channel=1)
for _ in range(5):
    halving.halving_doubling_allreduce(comm, data.copy(), p=0.05, average=True)
dist.barrier()
measuring[0] = True
start = time.perf_counter()
for _ in range(iters):
    halving.halving_doubling_allreduce(comm, data.copy(), p=0.05, average=True)
per_call = (time.perf_counter() - start) / iters
measuring[0] = False
dist.barrier()
if rank == 0:
    print(f"TRIAL={trial or '(none)'}: {per_call * 1e3:.2f} ms a call")
    for name, times in step_times.items():
        times.sort()
        median, p90 = times[len(times) // 2], times[int(len(times) * 0.9)]
        print(f"  step {name}: median {median * 1e3:.2f} ms, p90 {p90 * 1e3:.2f} ms")
    low = sorted(r for r in post_rates if r < 1249)
    print(f"  posts at a pacer rate below 1,250 MB/s: {len(low)} of {len(post_rates)}", low[:8])
endpoint.close()
