"""Bytecodes rank 0's threads execute per DDP iteration over DLCP's hook, in all and by
function (the TOPN busiest, default 40): dlcp.bench.ddp's model, the ring with p = 0.05,
threading.settrace with f_trace_opcodes, counted over ITERS iterations after 3.

    TOPN=45 python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ddp_bytecodes.py', '10'], 4, timeout=600)"
"""

import collections
import os
import sys
import threading

import torch
import torch.distributed as dist
from torch import nn

from dlcp.bench.ddp import build_model
from shims.ddp import DLCPState, dlcp_hook

iters = int(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
ops: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()
byfn: collections.Counter[tuple[str, str, str]] = collections.Counter()
on = [False]


def thread_name() -> str:
    t = threading.current_thread()
    return "main" if t is threading.main_thread() else "-".join(t.name.split("-")[:2])


def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
    frame.f_trace_opcodes = True
    th = thread_name()
    if on[0]:
        calls[th] += 1

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if on[0] and event == "opcode":
            ops[th] += 1
            co = frame.f_code
            where = co.co_filename.split("site-packages/")[-1].split("/work/main/")[-1]
            byfn[(th, where, co.co_name)] += 1
        return local

    return local


threading.settrace(tracer)
torch.manual_seed(0)
model = build_model(1664, 4, 1024, 10)
ddp = nn.parallel.DistributedDataParallel(model)
state = DLCPState(model=ddp, collective="ring", p=0.05)
ddp.register_comm_hook(state, dlcp_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1000 + rank)
x = torch.randn(32, 1024, generator=g)
y = torch.randint(0, 10, (32,), generator=g)


def step() -> None:
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()


for _ in range(3):
    step()
sys.settrace(tracer)
dist.barrier()
on[0] = True
for _ in range(iters):
    step()
on[0] = False
sys.settrace(None)
dist.barrier()
if rank == 0:
    for th in sorted(ops):
        per_iter = f"{ops[th] / iters:9.0f} bytecodes, {calls[th] / iters:7.0f} calls"
        print(f"thread {th}: {per_iter} an iteration")
    for th in sorted(ops):
        items = sorted(((k, v) for k, v in byfn.items() if k[0] == th), key=lambda kv: -kv[1])
        print("==", th)
        for k, v in items[: int(os.environ.get("TOPN", "40"))]:
            print(f"{v / iters:8.0f}  {k[1]}:{k[2]}")
state.close()
dist.destroy_process_group()
