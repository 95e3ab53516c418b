"""One rank of the process-group tests: ``python -m tests.shims.pg_worker <scenario>``.

Started by ``test_process_group.py`` the way ``torchrun`` starts ranks: RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment, and the store hosted
by the parent (TORCHELASTIC_USE_AGENT_STORE=True), so no port is guessed.

The worker imports ``dlcp`` *before* torch, so the backend comes from ``import
dlcp`` alone. ``init_process_group("dlcp")`` makes the default group DLCP's; a
second group over Gloo gives reference results. Every check runs on every rank
in the same order; the last stdout line is ``results <json>``: per check,
``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``. Then the last rank
exits without a word and the others report how their next all-reduce failed.
The registry and helpers live in ``pg_worker_common``, the DDP and bounded-loss
checks in ``pg_worker_ddp``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
import traceback
from typing import Any

import dlcp  # noqa: F401  - registers the backend; torch is not loaded yet

assert "torch" not in sys.modules, "import dlcp must not import torch"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing import assert_close  # noqa: E402

from tests.shims.pg_worker_common import (  # noqa: E402
    CHECKS,
    TIMEOUT,
    C,
    both,
    check,
    data,
    same_on_every_rank,
)

# ----------------------------------------------------------------------------- all_reduce


@check
def all_reduce_sum_float32_vs_gloo() -> dict[str, Any]:
    sizes = [1, C.world - 1, 1000, 300_001]
    for i, n in enumerate(sizes):
        a, b = both(lambda t, g: dist.all_reduce(t, group=g), data((n,), i, integer=True))
        assert torch.equal(a, b), f"n={n}"
        same_on_every_rank(a)
    from shims.process_group import dlcp_group

    reports = {}
    # random floats (sums in another order): a small tensor goes in one round (311 KB
    # to each of 2 peers), a large one over the ring (4.8 MB each: over 4 MiB in all)
    for n, seed in ((77_777, 9), (1_200_000, 10)):
        x = data((n,), seed)
        a, b = both(lambda t, g: dist.all_reduce(t, group=g), x)
        assert_close(a, b)
        same_on_every_rank(a)
        rep = dlcp_group().reports[-1]
        reports[n] = {"op": rep.op, "elems": rep.elems, "lost_elems": rep.lost_elems}
    return {"sizes": sizes, "reports": reports}


@check
def all_reduce_multidim_and_noncontiguous() -> None:
    x = data((4, 5, 6), 1, integer=True)
    a, b = both(lambda t, g: dist.all_reduce(t, group=g), x)
    assert torch.equal(a, b)
    # a non-contiguous view: the result must land in base, and only there (Gloo itself
    # mishandles such views, so the reference reduces the whole tensor)
    base = data((40, 30), 2, integer=True)
    full = base.clone()
    dist.all_reduce(full, group=C.gloo)
    want = base.clone()
    want.t()[:, ::2] = full.t()[:, ::2]
    view = base.t()[:, ::2]
    assert not view.is_contiguous()
    dist.all_reduce(view)
    assert torch.equal(base, want)


@check
def all_reduce_avg_and_half_types() -> None:
    x = data((1001,), 3, integer=True)
    total = x.clone()
    dist.all_reduce(total, group=C.gloo)
    avg = x.clone()
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    assert_close(avg, total / C.world)
    same_on_every_rank(avg)
    for dtype in (torch.float16, torch.bfloat16):
        h = data((513,), 4, dtype=dtype, integer=True)
        want = h.to(torch.float32)
        dist.all_reduce(want, group=C.gloo)
        dist.all_reduce(h)
        assert h.dtype == dtype
        assert torch.equal(h.to(torch.float32), want), dtype  # small integers: exact
        same_on_every_rank(h)


@check
def all_reduce_exact_types_and_ops() -> None:
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT]
    for dtype in (torch.int64, torch.int32, torch.float64):
        for op in ops:
            x = data((37,), 5, dtype=dtype, integer=True)
            if op == dist.ReduceOp.PRODUCT:
                x = x % 3 + 1
            a, b = both(lambda t, g, op=op: dist.all_reduce(t, op=op, group=g), x)
            assert torch.equal(a, b), (dtype, op)
    for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN):  # floats through the exact path
        a, b = both(lambda t, g, op=op: dist.all_reduce(t, op=op, group=g), data((999,), 6))
        assert torch.equal(a, b), op
    flags = torch.tensor([C.rank == 0, False, True])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    assert flags.tolist() == [True, False, True]
    bits = torch.tensor([1 << C.rank, 0xFF], dtype=torch.int64)
    dist.all_reduce(bits, op=dist.ReduceOp.BOR)
    assert bits.tolist() == [(1 << C.world) - 1, 0xFF]


@check
def all_reduce_async_future() -> None:
    x = torch.full((10,), float(C.rank + 1))
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    work.wait()
    want = float(sum(range(1, C.world + 1)))
    assert x.eq(want).all()
    assert doubled.wait().eq(2 * want).all()
    assert work.is_completed()


# ----------------------------------------------------------------------------- broadcast & co


@check
def broadcast_vs_gloo() -> None:
    cases = [
        data((1000,), 7),
        data((3, 4), 8, dtype=torch.int64),
        torch.tensor([C.rank % 2 == 0, True, False]),
        data((), 9),  # 0-dim
        data((600_000,), 10, dtype=torch.float16),
        data((5,), 11, dtype=torch.bfloat16),
        torch.zeros(0),
    ]
    for i, x in enumerate(cases):
        src = i % C.world
        a, b = both(lambda t, g, src=src: dist.broadcast(t, src=src, group=g), x)
        assert torch.equal(a, b), (i, x.dtype)
    base = data((20, 20), 12)
    full = base.clone()
    dist.broadcast(full, src=1, group=C.gloo)
    want = base.clone()
    want[::2, 1:] = full[::2, 1:]
    dist.broadcast(base[::2, 1:], src=1)  # non-contiguous view
    assert torch.equal(base, want)


@check
def all_gather_vs_gloo() -> None:
    for i, (shape, dtype) in enumerate([((17,), torch.float32), ((2, 3), torch.int64),
                                        ((40_000,), torch.float16), ((4,), torch.bool)]):
        x = data(shape, 20 + i, dtype=dtype) if dtype != torch.bool else torch.rand(shape) > 0.5
        mine = [torch.empty_like(x) for _ in range(C.world)]
        ref = [torch.empty_like(x) for _ in range(C.world)]
        dist.all_gather(mine, x)
        dist.all_gather(ref, x, group=C.gloo)
        for m, r in zip(mine, ref, strict=True):
            assert torch.equal(m, r), dtype
    x = data((3, 5), 30)
    out = torch.empty(C.world * 3, 5)
    ref = torch.empty(C.world * 3, 5)
    dist.all_gather_into_tensor(out, x)
    dist.all_gather_into_tensor(ref, x, group=C.gloo)
    assert torch.equal(out, ref)


@check
def all_gather_coalesced_vs_gloo() -> None:
    """Outputs are indexed rank first, then input (``outs[r][j]``: rank r's input j),
    with more inputs than ranks, of different shapes (torch wants one dtype)."""
    inputs = [data((2, 2), 40), data((1,), 41), data((3,), 42), data((5,), 43)]
    mine = [[torch.empty_like(x) for x in inputs] for _ in range(C.world)]
    ref = [[torch.empty_like(x) for x in inputs] for _ in range(C.world)]
    dist.all_gather_coalesced(mine, inputs)
    dist.all_gather_coalesced(ref, inputs, group=C.gloo)
    for r in range(C.world):
        for j in range(len(inputs)):
            assert torch.equal(mine[r][j], ref[r][j]), (r, j)
    assert all(torch.equal(a, b) for a, b in zip(mine[C.rank], inputs, strict=True))
    try:
        dist.all_gather_coalesced(mine[:-1], inputs)
    except ValueError as exc:
        assert "one list per rank" in str(exc), exc
    else:
        raise AssertionError("all_gather_coalesced took one output list too few")
    wrong = [list(outs) for outs in mine]
    wrong[C.world - 1][1] = torch.empty(7)
    try:
        dist.all_gather_coalesced(wrong, inputs)
    except ValueError as exc:
        assert f"output_lists[{C.world - 1}][1] is torch.float32[7]" in str(exc), exc
    else:
        raise AssertionError("all_gather_coalesced took an output of the wrong size")


@check
def reduce_scatter_gather_scatter_reduce() -> None:
    w, r = C.world, C.rank
    x = data((w * 6,), 40, integer=True)
    out = torch.empty(6)
    dist.reduce_scatter_tensor(out, x)
    total = x.clone()
    dist.all_reduce(total, group=C.gloo)
    assert torch.equal(out, total.view(w, 6)[r])
    outs = [torch.empty(6) for _ in range(1)]
    dist.reduce_scatter(outs[0], list(x.view(w, 6).unbind(0)))
    assert torch.equal(outs[0], total.view(w, 6)[r])

    g = data((4,), 41)
    got = [torch.empty(4) for _ in range(w)] if r == 1 else None
    ref = [torch.empty(4) for _ in range(w)]
    dist.gather(g, got, dst=1)
    dist.all_gather(ref, g, group=C.gloo)
    if r == 1:
        assert got is not None and all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))

    pieces = [torch.full((3,), 10.0 * k + 1) for k in range(w)] if r == 2 % w else None
    mine = torch.empty(3)
    dist.scatter(mine, pieces, src=2 % w)
    assert mine.eq(10.0 * r + 1).all()

    y = data((50,), 42, integer=True)
    kept = y.clone()
    dist.reduce(kept, dst=0)
    want = y.clone()
    dist.all_reduce(want, group=C.gloo)
    if r == 0:
        assert torch.equal(kept, want)


@check
def every_tensor_of_an_operation_is_reported() -> None:
    """An operation on several tensors runs a collective per tensor; each one's
    report is kept (the group kept only the last one's)."""
    from shims.process_group import dlcp_group

    pg = dlcp_group()
    before = len(pg.reports)
    ts = [torch.full((10 + k,), float(k + 1)) for k in range(3)]
    dist.all_reduce_coalesced(ts)
    assert all(t.eq((k + 1) * C.world).all() for k, t in enumerate(ts))
    assert len(pg.reports) - before == 3, len(pg.reports) - before
    assert [r.elems for r in list(pg.reports)[-3:]] == [10, 11, 12]


@check
def a_refused_gather_keeps_the_ranks_paired() -> None:
    """The root refuses a gather (a list of the wrong length); the others' gather
    goes through (the root's endpoint takes their data, unclaimed). The next
    operation must pair up on every rank, not meet the refused gather's messages."""
    w, r = C.world, C.rank
    g = torch.full((4,), float(r))
    if r == 0:
        try:
            dist.gather(g, [torch.empty(4) for _ in range(w + 1)], dst=0)
        except ValueError as exc:
            assert "gather" in str(exc), exc
        else:
            raise AssertionError("a gather list of the wrong length was accepted")
    else:
        dist.gather(g, None, dst=0)
    x = torch.full((1000,), float(r + 1))
    dist.all_reduce(x)
    assert x.eq(w * (w + 1) / 2).all(), x[:4]


@check
def a_failure_before_its_call_keeps_the_ranks_paired() -> None:
    """Staging fails on rank 0 alone (an injected MemoryError, as a failed host
    allocation would raise), before its all-reduce took a call number; the other
    ranks' all-reduce times out. The next all-reduce must pair up on every rank:
    rank 0's took the failed one's number and summed the others' old values."""
    import shims.pg_transport as pgt

    short = dist.new_group(backend="dlcp", timeout=datetime.timedelta(seconds=2))
    real = pgt.HostTensor

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("injected: host staging failed")

    if C.rank == 0:
        pgt.HostTensor = failing  # type: ignore[misc]
    try:
        first = torch.full((1000,), 10.0 + C.rank)
        try:
            dist.all_reduce(first, group=short)
        except Exception as exc:
            want = "MemoryError" if C.rank == 0 else "rank 0"
            assert want in f"{type(exc).__name__}: {exc}", exc
        else:
            raise AssertionError("the all-reduce of a failed rank went through")
    finally:
        pgt.HostTensor = real  # type: ignore[misc]
    # (rank 0 failed at once: it waits for the others' timeout, or its next receive
    # would time out before they send)
    dist.barrier(group=C.gloo)
    second = torch.full((1000,), 20.0 + C.rank)
    dist.all_reduce(second, group=short)
    want = sum(20.0 + q for q in range(C.world))
    assert second.eq(want).all(), f"{second[:4].tolist()} != {want}"
    dist.destroy_process_group(short)


@check
def coalescing_manager_and_functional_collectives() -> None:
    """``dist._coalescing_manager`` (its all_reduces go as one coalesced call) and
    the functional collectives (DTensor's, torch.compile's), which find a group by
    its name: torch's setter kept no name for a pure-Python group."""
    import torch.distributed._functional_collectives as fc

    w = C.world
    a, b = torch.full((5,), 1.0 + C.rank), torch.full((300_000,), 2.0)
    with dist._coalescing_manager(device=torch.device("cpu")):
        dist.all_reduce(a)
        dist.all_reduce(b)
    assert a.eq(sum(1.0 + q for q in range(w))).all() and b.eq(2.0 * w).all(), (a, b[:4])
    c = torch.ones(3)
    dist.all_reduce(c)  # (torch left the group coalescing: this did nothing)
    assert c.eq(w).all(), c
    # a failure inside the manager is raised (torch waits on _end_coalescing's work
    # alone, which succeeded whatever the operations did)
    from shims.process_group import dlcp_group

    pg = dlcp_group()
    real = pg._transport.allreduce

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected: this all-reduce fails on every rank")

    pg._transport.allreduce = failing  # type: ignore[method-assign]
    try:
        with dist._coalescing_manager(device=torch.device("cpu")):
            dist.all_reduce(torch.ones(4))
    except RuntimeError as exc:
        assert "injected" in str(exc), exc
    else:
        raise AssertionError("a failed coalesced all_reduce was reported as done")
    finally:
        pg._transport.allreduce = real  # type: ignore[method-assign]
    group = dist.group.WORLD
    assert isinstance(group.group_name, str) and group.group_name
    got = fc.wait_tensor(fc.all_reduce(torch.full((4,), float(C.rank)), "sum", group))
    assert got.eq(sum(range(w))).all(), got
    gathered = fc.wait_tensor(fc.all_gather_tensor(torch.full((2,), float(C.rank)), 0, group))
    assert gathered.tolist() == [float(q) for q in range(w) for _ in range(2)], gathered


@check
def barrier_waits_for_every_rank() -> None:
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pg-test/arrived/{C.rank}", "1")
    dist.barrier()
    # nobody leaves the barrier before everyone reached it
    store.wait([f"pg-test/arrived/{q}" for q in range(C.world)], datetime.timedelta(seconds=0.5))
    work = dist.barrier(async_op=True)
    work.wait()


@check
def object_collectives() -> None:
    objs: list[Any] = [None] * C.world
    dist.all_gather_object(objs, {"rank": C.rank, "name": "x" * (C.rank * 1000)})
    assert [o["rank"] for o in objs] == list(range(C.world))
    box: list[Any] = [{"from": C.rank}] if C.rank == 1 else [None]
    dist.broadcast_object_list(box, src=1)
    assert box == [{"from": 1}]


# ----------------------------------------------------------------------------- errors


@check
def unsupported_ops_raise_clear_errors() -> dict[str, str]:
    seen = {}
    try:
        dist.all_reduce(torch.zeros(3, dtype=torch.int64), op=dist.ReduceOp.AVG)
    except NotImplementedError as exc:
        assert "AVG" in str(exc) and "int64" in str(exc), str(exc)
        seen["avg_int64"] = str(exc)
    else:
        raise AssertionError("AVG of int64 did not raise")
    try:  # (a type torch cannot add on the CPU: refused before any message)
        dist.all_reduce(torch.zeros(3, dtype=torch.uint16))
    except NotImplementedError as exc:
        assert "allreduce with SUM of torch.uint16" in str(exc), str(exc)
        seen["sum_uint16"] = str(exc)
    else:
        raise AssertionError("SUM of uint16 did not raise")
    x = torch.ones(3)
    dist.all_reduce(x)  # (the ranks still meet)
    assert x.eq(C.world).all(), x
    return seen


@check
def mismatched_shapes_fail_loudly() -> dict[str, str]:
    x = torch.zeros(4 if C.rank == 0 else 5)
    try:
        dist.broadcast(x, src=0)
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": ""}


# ----------------------------------------------------------------------------- DDP, bounded loss

from tests.shims import pg_worker_ddp  # noqa: E402, F401 - registers its checks here

# ----------------------------------------------------------------------------- main


def main() -> int:
    torch.set_num_threads(1)
    dist.init_process_group("dlcp", timeout=TIMEOUT)
    C.rank, C.world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "dlcp"
    from shims.process_group import DLCPProcessGroup

    assert isinstance(dist.distributed_c10d._get_default_group(), DLCPProcessGroup)
    C.gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    results: dict[str, Any] = {}
    for name, fn in CHECKS:
        try:
            detail = fn()
            results[name] = {"ok": True, "detail": detail}
        except Exception as exc:
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()[-3000:]}
    report: dict[str, Any] = {"rank": C.rank, "checks": results}
    # (DDP broadcasts its parameters when built: every rank builds it now)
    after_failure = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    # the last rank leaves only once every rank's DDP broadcast is done, so that
    # the failure the check below sees is the all_reduce's (the endpoint now sends
    # a receive's STOP before its future completes, 8fd1e86: an exit right after
    # the broadcast no longer fails rank 0's send, which it did 1 run in 6)
    dist.barrier(group=C.gloo)
    if C.rank == C.world - 1:
        # the last rank dies without a word; the others must fail fast, not hang
        print("results " + json.dumps(report, default=str), flush=True)
        os._exit(0)
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10_000))
        report["rank_failure"] = {"raised": ""}
    except Exception as exc:
        report["rank_failure"] = {"raised": type(exc).__name__, "message": str(exc)}
    report["rank_failure"]["seconds"] = time.monotonic() - started
    try:  # unmodified DDP over the group: its reducer must raise, not crash the process
        after_failure(torch.ones(2, 4)).sum().backward()
        report["ddp_after_failure"] = {"raised": ""}
    except Exception as exc:
        report["ddp_after_failure"] = {"raised": type(exc).__name__, "message": str(exc)}
    dist.destroy_process_group()
    report["threads_after_destroy"] = [
        t.name for t in threading.enumerate() if t.name.startswith("dlcp")
    ]
    print("results " + json.dumps(report, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
