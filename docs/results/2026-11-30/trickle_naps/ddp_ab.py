"""The DDP job of dlcp.bench.ddp (4 ranks, the MLP of ~10M parameters, the DLCP hook's
ring, p = 0.05) with the receive loop's naps off (TRIAL_TRICKLE=0, trial_switch.diff)
and on, in iterations alternating ABBA within one job; an iteration's time is the
slowest rank's; CPU is the four processes' (os.times). Under dlcp.launch, in any
network namespace:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ddp_ab.py', '200'], 4, timeout=1800)"
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
times: dict[str, list[float]] = {"off": [], "on": []}
cpu: dict[str, list[float]] = {"off": [], "on": []}
for i in range(8 + iters):
    mode = ("off", "on", "on", "off")[i % 4]
    os.environ["TRIAL_TRICKLE"] = "1" if mode == "on" else "0"
    c0 = sum(os.times()[:2])
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    if i >= 8:
        times[mode].append(time.perf_counter() - t0)
        cpu[mode].append(sum(os.times()[:2]) - c0)
every: list = [None] * dist.get_world_size()
dist.all_gather_object(every, (times, cpu))
dist.barrier()
state.close()
del ddp, opt, state
dist.destroy_process_group()
if rank == 0:
    wall = {
        m: statistics.median(max(c) for c in zip(*(e[0][m] for e in every), strict=True))
        for m in times
    }
    proc = {
        m: statistics.mean(sum(c) for c in zip(*(e[1][m] for e in every), strict=True))
        for m in times
    }
    print(
        f"DDP iteration ms (median of {iters // 2}, slowest rank): off {wall['off'] * 1e3:.1f}, "
        f"on {wall['on'] * 1e3:.1f}, ratio {wall['on'] / wall['off']:.3f}; CPU ms per "
        f"iteration (4 processes): off {proc['off'] * 1e3:.1f}, on {proc['on'] * 1e3:.1f}, "
        f"ratio {proc['on'] / proc['off']:.3f}",
        flush=True,
    )
