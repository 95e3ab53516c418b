"""One rank of a 4-rank job that calls one 25 MB all-reduce kind in a loop.

    python ring_or_floor.py ring|floor ITERS OUTDIR     (as a rank of dlcp.launch)

``ring``: DLCP's ring (native engine, lossless loopback, p = 0, two layers);
``floor``: the UDP floor of dlcp.bench.allreduce (bare datagrams of DLCP's size).
After three warm-up calls rank 0 creates OUTDIR/go, and after ITERS calls
OUTDIR/done, so that a profiler attached from outside sees only the loop. Each
rank prints its wall and process CPU per call, and, per thread, user and system
CPU and voluntary / involuntary context switches per call (/proc); ``ring``
ranks also print the endpoint's driver counters per call. ``BURST_TIME`` in the
environment replaces the native engine's pacer burst (seconds; 200e-6 by default)."""

import dataclasses
import glob
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch.distributed as dist

import dlcp.io.engine
from dlcp.bench.allreduce import _floor
from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect


def threads() -> dict[str, tuple[str, int, int, int, int]]:
    out = {}
    for t in glob.glob(f"/proc/{os.getpid()}/task/*"):
        try:
            name = Path(t, "comm").read_text().strip()
            st = Path(t, "stat").read_text().rsplit(")", 1)[1].split()
            status = dict(
                line.split(":\t") for line in Path(t, "status").read_text().splitlines()
                if "ctxt" in line
            )
        except FileNotFoundError:  # (the thread ended)
            continue
        out[t] = (name, int(st[11]), int(st[12]), int(status["voluntary_ctxt_switches"]),
                  int(status["nonvoluntary_ctxt_switches"]))
    return out


if "BURST_TIME" in os.environ:
    dlcp.io.engine.NATIVE_BURST_TIME = float(os.environ["BURST_TIME"])
kind, iters, outdir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
n = 6_250_000
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
if kind == "floor":
    floor, why = _floor(rank, dist.get_world_size())
    assert floor is not None, why
    call = lambda: floor.allreduce(data)  # noqa: E731
else:
    endpoint, job = connect(group="ring-vs-floor")
    comm = Communicator(endpoint, job.world_size, channel=1)
    call = lambda: ring_allreduce(comm, data, segments=segments, p=0.0, average=True)  # noqa: E731
for _ in range(3):
    call()
dist.barrier()
if rank == 0:
    (outdir / "go").touch()
stats0 = dataclasses.asdict(endpoint._stats) if kind == "ring" else {}
t0 = threads()
c0, w0 = time.process_time(), time.perf_counter()
for _ in range(iters):
    call()
wall, cpu = (time.perf_counter() - w0) / iters, (time.process_time() - c0) / iters
t1 = threads()
print(f"{kind} rank {rank}: wall {wall * 1e3:.1f} ms, process CPU {cpu * 1e3:.1f} ms per call")
hz = os.sysconf("SC_CLK_TCK")
for t, (name, u, s, vol, inv) in t1.items():
    if t in t0:
        _, u0, s0, vol0, inv0 = t0[t]
        if u - u0 + s - s0 + vol - vol0:
            print(f"  thread {name:16s} user {1e3 * (u - u0) / hz / iters:5.1f} "
                  f"sys {1e3 * (s - s0) / hz / iters:5.1f} ms, switches voluntary "
                  f"{(vol - vol0) / iters:5.1f} involuntary {(inv - inv0) / iters:5.1f} per call")
if kind == "ring":
    stats1 = dataclasses.asdict(endpoint._stats)
    print("  driver counters per call:",
          {k: round((stats1[k] - stats0[k]) / iters, 1) for k in stats0})
dist.barrier()
if rank == 0:
    (outdir / "done").touch()
if kind == "ring":
    endpoint.close()
dist.destroy_process_group()
