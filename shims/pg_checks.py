"""What a dlcp process-group operation refuses, checked in the caller's thread
before anything is queued: the reduction, the root rank, tensors that cannot be
reduced that way, and gather/scatter lists of the wrong length, type or size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._C._distributed_c10d import ReduceOp

from dlcp.errors import UsageError

from .pg_tensors import FOLDS, TensorList, check_tensors

__all__ = ["check_gather_list", "check_reducible", "reduce_op", "root_rank"]

_Red = ReduceOp  # its members are the RedOpType values that opts.reduceOp.op holds


def reduce_op(opts: Any, op: str) -> Any:
    """The reduction ``opts`` asks for (SUM without options)."""
    red = getattr(getattr(opts, "reduceOp", None), "op", _Red.SUM)
    if red == _Red.PREMUL_SUM:
        raise NotImplementedError(f"dlcp process group does not implement {op} with PREMUL_SUM")
    return red


def root_rank(opts: Any, op: str, size: int) -> int:
    root = int(getattr(opts, "rootRank", 0))
    if not 0 <= root < size:
        raise UsageError(f"{op}: root rank {root} outside 0..{size - 1}")
    return root


def check_reducible(t: torch.Tensor, red: Any, op: str) -> None:
    float_like = t.is_floating_point() or t.is_complex()
    if red == _Red.AVG and not float_like:
        raise NotImplementedError(
            f"dlcp process group does not implement {op} with AVG of {t.dtype} tensors"
        )
    if red in (_Red.BAND, _Red.BOR, _Red.BXOR) and float_like:
        raise UsageError(f"{op}: {red.name} needs integer or bool tensors, got {t.dtype}")
    if red in (_Red.MAX, _Red.MIN) and t.is_complex():
        raise UsageError(f"{op}: {red.name} is undefined for complex tensors")
    fold, probe = FOLDS.get(red), torch.zeros(2, dtype=t.dtype)
    try:  # (on one element each: a type torch cannot fold fails here, before any message)
        if fold is not None:
            fold(probe[:1], probe[1:])
    except (NotImplementedError, RuntimeError):
        raise NotImplementedError(
            f"dlcp process group does not implement {op} with {red.name} of {t.dtype} "
            "tensors (torch cannot fold them on the CPU, where the group reduces)"
        ) from None


def check_gather_list(
    tensors: TensorList,
    like: torch.Tensor,
    op: str,
    size: int,
    *,
    label: Callable[[int], str] = lambda i: f"tensor {i}",
) -> None:
    """One tensor per rank, each of ``like``'s dtype and size; ``label`` names
    the i-th in an error."""
    check_tensors(tensors, op)
    if len(tensors) != size:
        raise UsageError(f"{op}: {len(tensors)} tensors in the list, world size {size}")
    for i, t in enumerate(tensors):
        if t.dtype != like.dtype or t.numel() != like.numel():
            raise UsageError(
                f"{op}: {label(i)} is {t.dtype}{list(t.shape)}, "
                f"expected {like.numel()} elements of {like.dtype}"
            )
