"""The process-group worker's DDP and bounded-loss checks (``pg_worker``
imports this where they run: after the error checks)."""

from __future__ import annotations

import copy
import os
import threading
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.testing import assert_close

from tests.shims.pg_worker_common import C, check, data, same_on_every_rank

# ----------------------------------------------------------------------------- DDP


def train(model: nn.Module, group: Any, steps: int, **ddp_kw: Any) -> DDP:
    ddp = DDP(model, process_group=group, **ddp_kw)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 + 10 * step + C.rank)
        x = torch.randn(32, 12, generator=g)
        y = torch.randn(32, 3, generator=g)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return ddp


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(),
                         nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


@check
def ddp_matches_gloo() -> dict[str, Any]:
    from shims.process_group import dlcp_group

    before = len(dlcp_group().reports)
    torch.manual_seed(C.rank)  # different on every rank: DDP must broadcast rank 0's
    model = net()
    over_dlcp = train(copy.deepcopy(model), None, steps=5)
    over_gloo = train(copy.deepcopy(model), C.gloo, steps=5)
    a, b = over_dlcp.module.state_dict(), over_gloo.module.state_dict()
    for name in a:  # parameters and buffers (BatchNorm's running statistics)
        assert_close(a[name], b[name], msg=lambda m, name=name: f"{name}: {m}")
    for _, prm in over_dlcp.module.named_parameters():
        same_on_every_rank(prm)  # buffers differ: each rank updated them in the last forward
    ops = Counter(r.op for r in list(dlcp_group().reports)[before:])
    return {"params": sum(p.numel() for p in model.parameters()), "ops": dict(ops)}


@check
def a_callback_may_wait_for_another_operation() -> None:
    """A future's callback runs in a transport thread; one that starts a second
    operation of the group and waits for it hung forever with one such thread
    (the second was queued behind the callback). Gloo runs it."""
    a, b = torch.ones(4), torch.ones(4)
    chained = dist.all_reduce(a, async_op=True).get_future().then(
        lambda _: dist.all_reduce(b)  # a blocking collective inside the callback
    )
    waiter = threading.Thread(target=chained.wait, daemon=True)
    waiter.start()
    waiter.join(60)
    assert not waiter.is_alive(), "a collective waited for inside a callback hung"
    assert a.eq(C.world).all() and b.eq(C.world).all(), (a, b)


@check
def ddp_powersgd_hook_matches_gloo() -> None:
    """torch's PowerSGD hook waits for all-reduces inside its future callbacks."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    torch.manual_seed(C.rank)
    model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 3))  # fmt: skip
    trained = []
    for group in (None, C.gloo):
        ddp = DDP(copy.deepcopy(model), process_group=group)
        state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                       start_powerSGD_iter=2, min_compression_rate=0.5,
                                       random_seed=0)  # fmt: skip
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for step in range(4):  # two plain steps, then two compressed ones
            g = torch.Generator().manual_seed(1000 + 10 * step + C.rank)
            loss = nn.functional.mse_loss(ddp(torch.randn(32, 12, generator=g)),
                                          torch.randn(32, 3, generator=g))  # fmt: skip
            opt.zero_grad()
            loss.backward()
            opt.step()
        trained.append(ddp.module)
    for (name, p), q in zip(trained[0].named_parameters(), trained[1].parameters(), strict=True):
        assert_close(p, q, msg=lambda m, name=name: f"{name}: {m}")
        same_on_every_rank(p)


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(12, 16)
        self.used = nn.Linear(16, 3)
        self.unused = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(torch.relu(self.trunk(x)))


@check
def ddp_find_unused_parameters_matches_gloo() -> None:
    torch.manual_seed(C.rank)
    model = Branchy()
    a = train(copy.deepcopy(model), None, steps=2, find_unused_parameters=True)
    b = train(copy.deepcopy(model), C.gloo, steps=2, find_unused_parameters=True)
    for (name, p), q in zip(a.module.named_parameters(), b.module.parameters(), strict=True):
        assert_close(p, q, msg=lambda m, name=name: f"{name}: {m}")


# ----------------------------------------------------------------------------- bounded loss


@check
def bounded_loss_group_keeps_replicas_identical() -> dict[str, Any]:
    from shims.process_group import DLCPOptions, dlcp_group

    # this group's endpoint drops 2 % of its received data datagrams (EMULATION,
    # read from the environment when the group is created): loss really happens
    os.environ["DLCP_EMULATED_LOSS"] = "0.02"
    os.environ["DLCP_EMULATED_LOSS_SEED"] = str(C.rank)
    try:
        lossy = dist.new_group(backend="dlcp", pg_options=DLCPOptions(p=0.05))
    finally:
        del os.environ["DLCP_EMULATED_LOSS"], os.environ["DLCP_EMULATED_LOSS_SEED"]
    pg = dlcp_group(lossy)
    assert pg.p == 0.05 and pg.endpoint.config.emulated_loss == 0.02
    x = data((200_000,), 50)
    a = x.clone()
    dist.all_reduce(a, group=lossy)
    rep = pg.reports[-1]
    assert 0 < rep.lost_fraction <= 0.05, rep  # some loss, within the bound
    same_on_every_rank(a)  # the exact all-gather keeps replicas identical
    b = x.clone()
    dist.all_reduce(b, group=C.gloo)
    # only lost elements differ from the exact sum: at most p of them
    differ = (a != b) & ~torch.isclose(a, b)
    assert int(differ.sum()) <= 0.05 * a.numel() * C.world, int(differ.sum())
    small = torch.ones(100)  # below lossy_min_elems: always exact, loss or not
    dist.all_reduce(small, group=lossy)
    assert small.eq(C.world).all()
    assert pg.reports[-1].lost_elems == 0
    os.environ["DLCP_DEFAULT_P"] = "0.02"
    try:
        from_env = dist.new_group(backend="dlcp")
    finally:
        del os.environ["DLCP_DEFAULT_P"]
    assert dlcp_group(from_env).p == 0.02
    # a gather bound with a small tensor: exact throughout (its p drops to 0, so must
    # the gather's), not refused for a gather bound above the push bound
    loose_gather = dist.new_group(backend="dlcp", pg_options=DLCPOptions(p=0.05, p_gather=0.01))
    small = torch.ones(100)
    dist.all_reduce(small, group=loose_gather)
    assert small.eq(C.world).all()
    # a gather bound above the group's p (0: DLCP_DEFAULT_P is unset) is refused when
    # the group is made, and the endpoint made for it is closed, not leaked
    io_threads = sum(t.name.startswith("dlcp-io") for t in threading.enumerate())
    try:
        dist.new_group(backend="dlcp", pg_options=DLCPOptions(p_gather=0.01))
    except Exception as exc:  # torch may wrap it
        assert "p_gather=0.01 exceeds the group's p=0" in str(exc), exc
    else:
        raise AssertionError("p_gather above p was accepted")
    assert sum(t.name.startswith("dlcp-io") for t in threading.enumerate()) == io_threads
    assert dlcp_group().p == 0.0
    return {"lost_fraction": rep.lost_fraction, "nack_rounds": rep.nack_rounds}
