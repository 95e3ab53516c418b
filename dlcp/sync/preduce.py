"""Partial all-reduce (P-Reduce): an all-reduce among a group of ranks only, on
DLCP endpoints, for the decentralised schemes (Ripples, DS-Sync).

The group's ``k`` members (ranks, sorted) cut the array into ``k`` contiguous
chunks; member ``i`` owns chunk ``i``. Reduce-scatter: every member sends chunk
``j`` to member ``j`` with the loss bound ``p`` (lost elements zero-filled or
rescaled, or with ``fill="previous"`` taken as this member's own value, its
estimate, as averaging parameters needs; reported); member ``i`` adds the ``k``
copies of its chunk in member order and divides by ``k`` for an average.
All-gather: member ``i`` sends its reduced chunk to every other member reliably
(bound 0). So every member ends with identical bytes, and with ``p = 0`` the
group's sum is preserved.

Messages: ``step`` is the group's id (``Group.gid``: unique in the schedule, so
two groups never meet), ``msg`` the sync channel with the scheme's role base.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ..errors import ConfigError, TransferFailed, UsageError, UsageStateError
from ..io.endpoint import Endpoint
from ..proto.config import FillPolicy
from .api import (
    StepReport,
    SyncScheme,
    WorkerFailed,
    check_loss_bound,
    check_world,
    sync_msg,
)
from .loss import LossTally

__all__ = ["GroupAveraging", "PReduceLoss", "preduce"]


#: what the reduce-scatter messages one member received lost
PReduceLoss = LossTally


def _bounds(n: int, k: int) -> list[int]:
    base, extra = divmod(n, k)
    out = [0]
    for i in range(k):
        out.append(out[-1] + base + (1 if i < extra else 0))
    return out


def preduce(
    endpoint: Endpoint,
    data: npt.NDArray[np.float32],
    members: Sequence[int],
    gid: int,
    *,
    role: int,
    p: float = 0.0,
    fill: FillPolicy = FillPolicy.ZERO,
    average: bool = True,
) -> PReduceLoss:
    """Reduce ``data`` (1-D float32, changed in place) over ``members``, of which
    this endpoint's rank is one (module docstring). ``role`` and ``role + 1`` are
    the two phases' message roles. A member that fails or goes silent raises
    :class:`WorkerFailed` naming it."""
    group = sorted(members)
    me = endpoint.rank
    if me not in group or len(set(group)) != len(group):
        raise UsageError(f"rank {me} is not one of the group's distinct members {group}")
    loss = PReduceLoss()
    k = len(group)
    if k == 1:
        return loss
    i = group.index(me)
    b = _bounds(len(data), k)
    rs, ag = sync_msg(role), sync_msg(role + 1)
    mine = data[b[i] : b[i + 1]]
    # (previous: a member's lost element keeps this member's own value, its estimate)
    scratch = {m: mine.copy() if fill is FillPolicy.PREVIOUS else np.empty_like(mine)
               for m in group if m != me}  # fmt: skip
    futs: list[tuple[int, Future[Any]]] = []
    sends: list[tuple[int, Future[Any]]] = []
    try:
        if b[i] < b[i + 1]:
            for m, buf in scratch.items():
                futs.append((m, endpoint.recv(src=m, step=gid, msg=rs, out=buf, p=p, fill=fill)))
        for j, m in enumerate(group):
            if m != me and b[j] < b[j + 1]:
                sends.append((m, endpoint.send(data[b[j] : b[j + 1]], to=m, step=gid, msg=rs,
                                               p=p)))  # fmt: skip
        for m, fut in futs:
            loss.add(_wait(endpoint, fut, m), bounded=p > 0)
        futs = []
        if b[i] < b[i + 1]:
            total = np.zeros(b[i + 1] - b[i], np.float32)
            for m in group:  # member order: the same additions on every run
                total += data[b[i] : b[i + 1]] if m == me else scratch[m]
            if average:
                total /= np.float32(k)
            data[b[i] : b[i + 1]] = total
        for j, m in enumerate(group):
            if m != me and b[j] < b[j + 1]:
                futs.append((m, endpoint.recv(src=m, step=gid, msg=ag, out=data[b[j] : b[j + 1]],
                                              p=0.0)))  # fmt: skip
        if b[i] < b[i + 1]:
            for m in group:
                if m != me:
                    sends.append((m, endpoint.send(data[b[i] : b[i + 1]], to=m, step=gid, msg=ag,
                                                   p=0.0)))  # fmt: skip
        for m, fut in futs:
            _wait(endpoint, fut, m)
        futs = []
        for m, fut in sends:
            _wait(endpoint, fut, m)
        sends = []
    except BaseException:
        for _, fut in (*futs, *sends):
            fut.cancel()
        raise
    return loss


def _wait(endpoint: Endpoint, fut: Future[Any], peer: int) -> Any:
    try:
        return fut.result(timeout=endpoint.config.timeout + 5.0)
    except TransferFailed as exc:
        raise WorkerFailed(
            f"rank {endpoint.rank}: group member rank {peer} failed: {exc}", peer
        ) from exc
    except TimeoutError as exc:  # (a future nobody settled)
        fut.cancel()
        raise WorkerFailed(f"rank {endpoint.rank}: group member rank {peer} went silent",
                           peer) from exc  # fmt: skip


class GroupAveraging(SyncScheme):
    """A scheme whose ``step()`` runs the optimizer, then averages the parameters
    with the group :meth:`next_group` names (P-Reduce; a group of one moves nothing)."""

    #: message roles of this scheme's reduce-scatter (and, + 1, all-gather)
    role = 16

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        endpoint: Endpoint,
        world_size: int,
        p: float = 0.0,
        fill: str | FillPolicy = FillPolicy.PREVIOUS,
    ) -> None:
        check_world(endpoint.rank, world_size)
        check_loss_bound("p", p)
        self.fill = FillPolicy(fill) if isinstance(fill, str) else fill
        if self.fill is not FillPolicy.PREVIOUS and p > 0:
            raise ConfigError(
                f"fill='{self.fill.value}' with p={p}: averaging parameters, a lost element "
                "filled so pulls the average away from the replicas' values; use "
                "'previous' (this rank's own value stands for it)"
            )
        super().__init__(model, optimizer)
        self.endpoint, self.world_size, self.p = endpoint, world_size, p
        self.rank = endpoint.rank

    def next_group(self) -> tuple[int, tuple[int, ...]]:
        """(group id, members) of this rank's next averaging."""
        raise NotImplementedError

    def step(self) -> StepReport:
        if self._closed:
            raise UsageStateError(f"rank {self.rank}: step() after close()")
        self.local_update()
        gid, members = self.next_group()
        t0 = time.perf_counter()
        flat = self.flat.read()
        loss = preduce(self.endpoint, flat, members, gid, role=self.role, p=self.p,
                       fill=self.fill)  # fmt: skip
        self.flat.write(flat)
        self.clock += 1
        report = StepReport(
            scheme=self.name,
            clock=self.clock,
            version=self.clock,
            lost_elems=loss.lost,
            bounded_elems=loss.bounded,
            lost_chunks=tuple(loss.lost_chunks),
            class_chunks=tuple(loss.class_chunks),
            group=tuple(sorted(members)),
            wait_seconds=time.perf_counter() - t0,
            extra={"gid": float(gid)},
        )
        self.reports.append(report)
        return report

    def close(self) -> None:
        self._closed = True
