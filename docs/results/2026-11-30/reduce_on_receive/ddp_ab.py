"""The DDP job of dlcp.bench.ddp (4 ranks, the MLP of ~10M parameters, the DLCP
hook's ring, p = 0.05, lossless loopback) with its reduce-scatter received into
scratch (TRIAL_SCRATCH set: ``trial_switch.diff`` applied) and added on receive, in
alternate iterations of one job; an iteration's time is the slowest rank's, as the
benchmark takes it. Under dlcp.launch:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ddp_ab.py', '200'], 4, timeout=900)"
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from dlcp.bench.ddp import build_model
from shims.ddp import DLCPState, dlcp_hook

iters = int(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = build_model(1664, 4, 1024, 10)
ddp = nn.parallel.DistributedDataParallel(model)
state = DLCPState(model=ddp, collective="ring", p=0.05)
ddp.register_comm_hook(state, dlcp_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1000 + rank)
x = torch.randn(32, 1024, generator=g)
y = torch.randint(0, 10, (32,), generator=g)
times: dict[str, list[float]] = {"scratch": [], "accumulate": []}
for i in range(6 + iters):
    mode = ("scratch", "accumulate")[i % 2]
    if mode == "scratch":
        os.environ["TRIAL_SCRATCH"] = "1"
    else:
        os.environ.pop("TRIAL_SCRATCH", None)
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    if i >= 6:
        times[mode].append(time.perf_counter() - t0)
every: list = [None] * dist.get_world_size()
dist.all_gather_object(every, times)
dist.barrier()
state.close()
del ddp, opt, state
dist.destroy_process_group()
if rank == 0:
    med = {
        m: statistics.median(max(c) for c in zip(*(e[m] for e in every), strict=True))
        for m in times
    }
    print(
        f"DDP iteration ms (median of {iters // 2}, slowest rank): scratch "
        f"{med['scratch'] * 1e3:.1f}, accumulate {med['accumulate'] * 1e3:.1f}, "
        f"ratio {med['accumulate'] / med['scratch']:.3f}"
    )
