"""What every module of the process-group worker shares (``pg_worker``): the
checks' registry, in registration order, the rank's context and data helpers.
Imported after ``dlcp`` (see ``pg_worker``)."""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=30)
CHECKS: list[tuple[str, Callable[[], Any]]] = []


def check(fn: Callable[[], Any]) -> Callable[[], Any]:
    CHECKS.append((fn.__name__, fn))
    return fn


class Ctx:
    rank: int
    world: int
    gloo: Any


C = Ctx()


def data(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32,
         integer: bool = False) -> torch.Tensor:
    """Rank-dependent data; integer-valued when sums must be exact in any order."""
    g = torch.Generator().manual_seed(seed * 101 + C.rank)
    if integer or not dtype.is_floating_point:
        return torch.randint(-50, 50, shape, generator=g).to(dtype)
    return torch.randn(shape, generator=g).to(dtype)


def digest(t: torch.Tensor) -> str:
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def same_on_every_rank(t: torch.Tensor) -> None:
    got: list[Any] = [None] * C.world
    dist.all_gather_object(got, digest(t), group=C.gloo)
    assert len(set(got)) == 1, f"ranks hold different bytes: {got}"


def both(op: Callable[[torch.Tensor, Any], Any],
         t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``op`` on a copy of ``t`` over DLCP (default group) and over Gloo."""
    a, b = t.clone(), t.clone()
    op(a, None)
    op(b, C.gloo)
    return a, b
