"""One rank of the DDP hook tests: ``python -m tests.training.ddp_worker``.

Started by :func:`dlcp.launch.launch` (torchrun's ``env://`` variables). Builds
three replicas of one multi-layer model with identical initial weights: one
under plain DDP over Gloo (the reference), one with the DLCP hook over a ring
all-reduce and one with the DLCP hook over a PS-style all-reduce (every rank
serves a shard), each hook on an endpoint of its own. Small DDP buckets make
the replicas use one bucket in the first iteration and two once DDP has
rebuilt them (the hook must not key on early bucket indices). For a few
iterations each rank feeds the three replicas the same batch (different on
every rank) and asserts with ``torch.testing.assert_close`` that the DLCP
gradients equal Gloo's. Any mismatch raises, so the rank exits non-zero.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

ITERATIONS = 4


def build() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 64),
        nn.LayerNorm(64),
        nn.ReLU(),
        nn.Linear(64, 32),
        nn.ReLU(),
        nn.Linear(32, 10),
    )


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from dlcp.rendezvous import connect
    from shims.ddp import DLCPState, dlcp_hook

    torch.manual_seed(0)
    template = build()
    replicas: dict[str, nn.parallel.DistributedDataParallel] = {}
    states: dict[str, DLCPState] = {}
    from shims.tcp_ps import TcpPsState, tcp_ps_hook

    for name in ("gloo", "ring", "direct", "halving", "ps", "tcp_ps"):
        model = build()
        model.load_state_dict(template.state_dict())
        # ~16 KB buckets: the 33k-parameter model spreads over several buckets
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.016)
        if name == "tcp_ps":  # the TCP parameter-server baseline (Gloo send/recv)
            ddp.register_comm_hook(TcpPsState(server=1), tcp_ps_hook)
        elif name != "gloo":
            endpoint, _ = connect(group=f"test-{name}")
            states[name] = DLCPState(
                model=ddp,
                collective={"ps": "ps", "halving": "halving-doubling"}.get(name, "ring"),
                p=0.0,
                endpoint=endpoint,
                world_size=world,
                direct_max_bytes=0 if name == "ring" else 4 << 20,  # ring: never direct
            )
            ddp.register_comm_hook(states[name], dlcp_hook)
        replicas[name] = ddp
    g = torch.Generator().manual_seed(1000 + rank)
    for _ in range(ITERATIONS):
        x = torch.randn(16, 1, 8, 8, generator=g)
        y = torch.randint(0, 10, (16,), generator=g)
        for ddp in replicas.values():
            ddp.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(ddp(x), y).backward()
        ref = [p.grad for p in replicas["gloo"].parameters()]
        for name in ("ring", "direct", "halving", "ps", "tcp_ps"):
            got = [p.grad for p in replicas[name].parameters()]
            assert len(got) == len(ref)
            for i, (a, b) in enumerate(zip(got, ref, strict=True)):
                assert a is not None and b is not None
                torch.testing.assert_close(a, b, msg=lambda m, n=name, i=i: f"{n} param {i}: {m}")
    summary = {
        name: {
            "steps": len(st.metrics.history),
            "buckets": [s.buckets for s in st.metrics.history],
            "lost_elems": sum(s.lost_elems for s in st.metrics.history),
            "ops": sorted({op for s in st.metrics.history for op in s.ops}),
        }
        for name, st in states.items()
    }
    logging.getLogger("dlcp.io").setLevel(logging.ERROR)  # peers closing at the end
    dist.barrier()
    for st in states.values():
        st.close()
        assert st.endpoint is not None
        st.endpoint.close()
    dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DLCP_TIMEOUT", "30")
    sys.exit(main())
