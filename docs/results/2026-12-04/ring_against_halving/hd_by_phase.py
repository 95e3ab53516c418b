"""Halving-doubling's bytecodes: ``../ddp_bytecodes/ring_by_phase.py`` with
``halving_doubling_allreduce`` in place of the ring (run it as that one is run).
Bytecodes rank 0's I/O thread and caller execute per 25 MB ring call, by phase:
each bytecode counts for every frame of the call chain it ran under, below the I/O
thread's ``_run`` or the caller's ``ring_allreduce``, to DEPTH frames (default 5), and
a chain is printed where it holds at least MIN bytecodes a call (default 300).
threading.settrace with f_trace_opcodes, as ``../../2026-12-02/io_thread_bytecodes/
bytecodes.py`` counts by function.

    DLCP_FINISH_TIMEOUT=5 DEPTH=4 MIN=200 python -c "import sys; from dlcp.launch import
        launch; launch([sys.executable, 'ring_by_phase.py', '4', '6250000', '0.05'], 4,
        timeout=800)"

Walking the stack at every bytecode slows the traced threads enough for the FINISH
timer (0.2 s) to fire in a lossless ring: a FINISH timeout of 5 s keeps those
resends, which untraced calls do not make, out of the counts.
"""

import collections
import os
import sys
import threading

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator, halving_doubling_allreduce
from dlcp.rendezvous import connect

DEPTH = int(os.environ.get("DEPTH", "5"))
MIN = float(os.environ.get("MIN", "300"))
#: names that several modules define: shown with their module's name
SHARED_NAMES = {"__init__", "send", "recv", "post", "wait", "result", "_post_round",
                "complete", "handle_timer", "next_timer", "on_control"}  # fmt: skip
ROOTS = ("_run", "halving_doubling_allreduce")

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
ops: collections.Counter[str] = collections.Counter()
by_chain: collections.Counter[tuple[str, str]] = collections.Counter()
on = [False]


def _name(code) -> str:  # type: ignore[no-untyped-def]
    if code.co_name not in SHARED_NAMES:
        return str(code.co_name)
    return f"{code.co_name}@{code.co_filename.rsplit('/', 1)[-1].removesuffix('.py')}"


def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
    frame.f_trace_opcodes = True
    current = threading.current_thread()
    th = "main" if current is threading.main_thread() else "-".join(current.name.split("-")[:2])

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if on[0] and event == "opcode":
            ops[th] += 1
            chain = []
            f = frame
            while f is not None:
                chain.append(_name(f.f_code))
                f = f.f_back
            chain.reverse()
            for root in ROOTS:
                if root in chain:
                    chain = chain[chain.index(root) + 1 :]
                    break
            for depth in range(1, min(len(chain), DEPTH) + 1):
                by_chain[(th, " > ".join(chain[:depth]))] += 1
        return local

    return local


threading.settrace(tracer)
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="bytecodes")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    halving_doubling_allreduce(comm, data, segments=segments, p=p, average=True)
sys.settrace(tracer)
dist.barrier()
on[0] = True
for _ in range(iters):
    halving_doubling_allreduce(comm, data, segments=segments, p=p, average=True)
on[0] = False
sys.settrace(None)
dist.barrier()
if rank == 0:
    for th in sorted(ops):
        print(f"thread {th}: {ops[th] / iters:9.0f} bytecodes a ring call")
    for th in ("dlcp-io", "main"):
        print("==", th)
        for (t, chain), v in sorted(by_chain.items(), key=lambda kv: kv[0][1]):
            if t == th and v / iters >= MIN:
                print(f"{v / iters:8.0f}  {chain}")
endpoint.close()
