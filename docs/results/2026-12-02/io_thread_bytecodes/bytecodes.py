"""Bytecodes rank 0's I/O thread and caller execute per 25 MB ring call, in all and
by function (the TOPN busiest, default 40): threading.settrace with f_trace_opcodes,
counted while measuring.

    TOPN=200 python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'bytecodes.py', '10', '6250000', '0.05'], 4, timeout=600)"
"""

import collections
import os
import sys
import threading

import numpy as np
import torch.distributed as dist

import dlcp.collectives.ring as ring
from dlcp.collectives import Communicator
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
ops = collections.Counter()
byfn = collections.Counter()
calls = collections.Counter()
on = [False]


def tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    name = threading.current_thread().name.split("-")
    th = "main" if threading.current_thread() is threading.main_thread() else "-".join(name[:2])
    if on[0]:
        calls[th] += 1

    def local(frame, event, arg):
        if on[0] and event == "opcode":
            ops[th] += 1
            co = frame.f_code
            byfn[
                (
                    th,
                    co.co_filename.split("site-packages/")[-1].split("/work/main/")[-1],
                    co.co_name,
                )
            ] += 1
        return local

    return local


threading.settrace(tracer)
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="bytecodes")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
sys.settrace(tracer)
dist.barrier()
on[0] = True
for _ in range(iters):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
on[0] = False
sys.settrace(None)
dist.barrier()
if rank == 0:
    for th in sorted(ops):
        per_call = f"{ops[th] / iters:9.0f} bytecodes, {calls[th] / iters:7.0f} Python calls"
        print(f"thread {th}: {per_call} a ring call")
    for th in ("dlcp-io", "main"):
        items = sorted(((k, v) for k, v in byfn.items() if k[0] == th), key=lambda kv: -kv[1])
        print("==", th)
        for k, v in items[: int(os.environ.get("TOPN", "40"))]:
            print(f"{v / iters:8.0f}  {k[1]}:{k[2]}")
endpoint.close()
