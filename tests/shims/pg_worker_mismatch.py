"""One rank of the cross-rank misuse tests of the dlcp process group:
``python -m tests.shims.pg_worker_mismatch``, started by ``test_pg_mismatch.py``
as ``pg_worker`` is started by ``test_process_group.py`` (torchrun's env://
variables, the store hosted by the parent).

Every check runs on every rank in the same order, but the ranks pass what a
mistaken program passes: tensors of other dtypes of one byte size, collectives
in other orders, an empty tensor on some ranks only. Each case's outcome on
this rank (what it raised, or the values it got) is reported; the last stdout
line is ``results <json>``. The checks use a dlcp group of their own with a
short timeout, so a case that hangs shows as a timeout within seconds."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

os.environ["DLCP_CHECK_COLLECTIVES"] = "1"  # (the checks these cases are about; off by default)

import dlcp  # noqa: F401  - registers the backend
from tests.shims.pg_worker_common import CHECKS, TIMEOUT, C, check

#: the timeout of the group the checks use
SHORT = datetime.timedelta(seconds=8)
G: dict[str, Any] = {}


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """What ``fn`` raised on this rank (type, message, seconds), or what it returned."""
    started = time.monotonic()
    try:
        got = fn()
    except Exception as exc:
        return {
            "raised": type(exc).__name__,
            "message": str(exc),
            "seconds": time.monotonic() - started,
        }
    return {"raised": "", "value": got, "seconds": time.monotonic() - started}


def still_paired() -> None:
    """The ranks' next collective on the group meets (after a refused one)."""
    x = torch.ones(4)
    dist.all_reduce(x, group=G["pg"])
    assert x.eq(C.world).all(), x


def values(t: torch.Tensor) -> list[Any]:
    return t.tolist()  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------- dtypes


@check
def other_dtypes_of_one_byte_size() -> dict[str, Any]:
    """Rank 0 passes int64 (or int32) tensors, the others float64 (float32)."""
    pg = G["pg"]
    first = C.rank == 0
    seen: dict[str, Any] = {}

    def all_reduce_max() -> list[Any]:
        x = (
            torch.arange(8, dtype=torch.int64)
            if first
            else torch.arange(8, dtype=torch.float64) / 2
        )
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=pg)
        return values(x)

    def broadcast() -> list[Any]:
        x = torch.arange(6, dtype=torch.int32) if first else torch.zeros(6)
        dist.broadcast(x, src=0, group=pg)
        return values(x)

    def all_gather() -> list[Any]:
        dtype = torch.int64 if first else torch.float64
        x = torch.full((4,), C.rank + 1, dtype=dtype)
        outs = [torch.zeros(4, dtype=dtype) for _ in range(C.world)]
        dist.all_gather(outs, x, group=pg)
        return [values(o) for o in outs]

    def all_to_all_single() -> list[Any]:
        dtype = torch.int32 if first else torch.float32
        x = torch.full((C.world * 2,), C.rank + 1, dtype=dtype)
        out = torch.zeros_like(x)
        dist.all_to_all_single(out, x, group=pg)
        return values(out)

    for name, fn in (
        ("all_reduce", all_reduce_max),
        ("broadcast", broadcast),
        ("all_gather", all_gather),
        ("all_to_all_single", all_to_all_single),
    ):
        seen[name] = outcome(fn)
    still_paired()
    return seen


@check
def other_reductions() -> dict[str, Any]:
    """Rank 0 reduces with MAX, the others with SUM (one dtype everywhere)."""
    op = dist.ReduceOp.MAX if C.rank == 0 else dist.ReduceOp.SUM

    def all_reduce() -> list[Any]:
        x = torch.arange(4, dtype=torch.int64) + C.rank
        dist.all_reduce(x, op=op, group=G["pg"])
        return values(x)

    seen = outcome(all_reduce)
    still_paired()
    return seen


# ----------------------------------------------------------------------------- order


@check
def collectives_in_other_orders() -> dict[str, Any]:
    """Even ranks: an exact all-reduce, then an all_gather of one size; odd ranks
    the other way round. Both are refused on every rank (not swapped)."""
    pg = G["pg"]

    def all_reduce() -> list[Any]:
        x = torch.arange(4, dtype=torch.int64) * (C.rank + 1)
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=pg)
        return values(x)

    def all_gather() -> list[Any]:
        x = torch.full((4,), 10 + C.rank, dtype=torch.int64)
        outs = [torch.zeros(4, dtype=torch.int64) for _ in range(C.world)]
        dist.all_gather(outs, x, group=pg)
        return [values(o) for o in outs]

    order = [("all_reduce", all_reduce), ("all_gather", all_gather)]
    if C.rank % 2:
        order.reverse()
    seen = {name: outcome(fn) for name, fn in order}
    still_paired()
    return seen


@check
def a_float_all_reduce_beside_a_broadcast() -> dict[str, Any]:
    """Rank 0 broadcasts 64 float32 values while the others all-reduce them (a
    float SUM: the direct one-round all-reduce), both of 256 bytes. The others
    refuse; the root, which only sends, completes or sees its sends refused."""
    x = torch.full((64,), float(C.rank + 1))
    if C.rank == 0:
        seen = outcome(lambda: dist.broadcast(x, src=0, group=G["pg"]))
    else:
        seen = outcome(lambda: dist.all_reduce(x, group=G["pg"]))
    still_paired()
    return seen


# ----------------------------------------------------------------------------- empty


@check
def an_empty_tensor_on_every_rank_completes() -> dict[str, Any]:
    pg = G["pg"]
    seen = {}
    for name, fn in (
        ("all_reduce_sum", lambda: dist.all_reduce(torch.zeros(0), group=pg)),
        (
            "all_reduce_max_int64",
            lambda: dist.all_reduce(
                torch.zeros(0, dtype=torch.int64), op=dist.ReduceOp.MAX, group=pg
            ),
        ),
        ("broadcast", lambda: dist.broadcast(torch.zeros(0, 3), src=0, group=pg)),
        (
            "all_gather",
            lambda: dist.all_gather(
                [torch.zeros(0) for _ in range(C.world)], torch.zeros(0), group=pg
            ),
        ),
    ):
        seen[name] = outcome(fn)
    still_paired()
    return seen


@check
def an_empty_tensor_on_one_rank_is_refused() -> dict[str, Any]:
    """Rank 0 passes an empty tensor, the others 8 elements."""
    pg = G["pg"]
    n = 0 if C.rank == 0 else 8
    seen = {}
    for name, fn in (
        (
            "all_reduce_max_int64",
            lambda: dist.all_reduce(
                torch.ones(n, dtype=torch.int64), op=dist.ReduceOp.MAX, group=pg
            ),
        ),
        ("all_reduce_sum", lambda: dist.all_reduce(torch.ones(n), group=pg)),
        ("all_reduce_sum_ring", lambda: dist.all_reduce(torch.ones(n * 200_000), group=pg)),
        ("broadcast", lambda: dist.broadcast(torch.ones(n), src=0, group=pg)),
    ):
        seen[name] = outcome(fn)
    still_paired()
    return seen


# ----------------------------------------------------------------------------- main


def main() -> int:
    torch.set_num_threads(1)
    dist.init_process_group("dlcp", timeout=TIMEOUT)
    C.rank, C.world = dist.get_rank(), dist.get_world_size()
    C.gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    G["pg"] = dist.new_group(backend="dlcp", timeout=SHORT)
    results: dict[str, Any] = {}
    only = os.environ.get("PG_WORKER_CHECKS")  # (a comma-separated subset, to debug)
    for name, fn in CHECKS:
        if only and name not in only.split(","):
            continue
        print(f"rank {C.rank}: {name}", file=sys.stderr, flush=True)  # (where a hang is)
        try:
            results[name] = {"ok": True, "detail": fn()}
        except Exception as exc:
            results[name] = {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:],
            }
            print(f"rank {C.rank}: {name} failed: {exc}", file=sys.stderr, flush=True)
        dist.barrier(group=C.gloo)  # (a check's stragglers never meet the next one)
    print("results " + json.dumps({"rank": C.rank, "checks": results}, default=str), flush=True)
    sys.stderr.flush()
    os._exit(0)  # (as pg_worker_p2p: no teardown of a group whose operations failed)


if __name__ == "__main__":
    sys.exit(main())
