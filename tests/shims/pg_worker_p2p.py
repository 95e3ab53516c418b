"""One rank of the point-to-point, all-to-all and sparse tests of the dlcp
process group: ``python -m tests.shims.pg_worker_p2p``, started by
``test_pg_p2p.py`` as ``pg_worker`` is started by ``test_process_group.py``
(torchrun's env:// variables, the store hosted by the parent). Every check runs
on every rank in the same order, compared with the same operation over Gloo in
a second group; the last stdout line is ``results <json>``.

To debug: each rank writes every check's name and time to stderr (where a hang
is), ``PG_WORKER_CHECKS=name,name`` runs only those checks, and ``kill -USR1``
of a rank prints every thread's stack."""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch.testing import assert_close

import dlcp  # noqa: F401  - registers the backend
from tests.shims.pg_worker_common import CHECKS, TIMEOUT, C, check, data

# ----------------------------------------------------------------------------- point-to-point


def tensors(seed: int) -> list[torch.Tensor]:
    """Tensors of several dtypes and layouts (a strided view, an empty one)."""
    return [
        data((5, 7), seed),
        data((3, 4), seed + 1, torch.int64),
        data((6,), seed + 2, torch.bfloat16),
        data((4, 6), seed + 3).t(),  # not contiguous
        data((9,), seed + 4, torch.bool),
        torch.empty(0),
    ]


def ring_exchange(group: Any, seed: int) -> list[torch.Tensor]:
    """Blocking send to the next rank, then receive from the previous one (Gloo's
    own point-to-point takes contiguous tensors only)."""
    nxt, prv = (C.rank + 1) % C.world, (C.rank - 1) % C.world
    got = []
    for t in tensors(seed):
        if group is not None:
            t = t.contiguous()
        into = torch.zeros_like(t) if group is not None else torch.zeros_like(t.t()).t()
        if C.rank % 2 == 0:
            dist.send(t, dst=nxt, group=group)
            dist.recv(into, src=prv, group=group)
        else:  # (Gloo's blocking send waits for the receive: odd ranks receive first)
            dist.recv(into, src=prv, group=group)
            dist.send(t, dst=nxt, group=group)
        got.append(into)
    return got


@check
def send_recv_match_gloo() -> None:
    a, b = ring_exchange(None, 10), ring_exchange(C.gloo, 10)
    g = torch.Generator().manual_seed(10 * 101 + (C.rank - 1) % C.world)
    assert_close(a[0], torch.randn((5, 7), generator=g))  # the previous rank's data
    for x, y in zip(a, b, strict=True):
        assert_close(x, y, rtol=0, atol=0)


@check
def tags_are_matched_independently_and_in_order() -> dict[str, Any]:
    """Rank 0 sends tag 7 twice, then tag 3; rank 1 receives tag 3 first, then
    the two tag-7 messages in the order they were sent."""
    if C.rank == 0:
        for v, tag in ((1.0, 7), (2.0, 7), (3.0, 3)):
            dist.send(torch.full((4,), v), dst=1, tag=tag)
    elif C.rank == 1:
        x = torch.zeros(4)
        dist.recv(x, src=0, tag=3)
        assert x.eq(3.0).all(), x
        first, second = torch.zeros(4), torch.zeros(4)
        w2 = dist.irecv(second, src=0, tag=7)  # posted first: the first message
        w1 = dist.irecv(first, src=0, tag=7)
        w2.wait()
        w1.wait()
        assert second.eq(1.0).all() and first.eq(2.0).all(), (first, second)
    dist.barrier(group=C.gloo)
    return {}


@check
def isend_irecv_and_their_work() -> dict[str, Any]:
    """Async point-to-point: the works' state agrees at once after wait(), and
    the futures carry the tensors."""
    nxt, prv = (C.rank + 1) % C.world, (C.rank - 1) % C.world
    outs = [torch.zeros(1000) for _ in range(20)]
    recvs = [dist.irecv(o, src=prv, tag=i) for i, o in enumerate(outs)]
    sends = [dist.isend(torch.full((1000,), 100.0 * C.rank + i), dst=nxt, tag=i)
             for i in range(20)]
    for w in [*sends, *recvs]:
        assert w is not None
        w.wait()
        assert w.is_completed() and w.is_success() and w.get_future().done()
    for i, o in enumerate(outs):
        assert o.eq(100.0 * prv + i).all(), (i, o[:3])
    value = recvs[0].get_future().wait()
    assert value[0] is outs[0], value
    return {}


@check
def recv_from_any_source_reports_the_source() -> dict[str, int]:
    """Every other rank sends rank 0 two messages holding its rank; rank 0 takes
    them from any source, half with dist.recv (which returns the source), half
    with irecv (whose work tells it): each source's value, twice per rank."""
    seen: dict[str, int] = {}
    if C.rank == 0:
        for _ in range(C.world - 1):
            x = torch.zeros(3)
            src = dist.recv(x)
            assert x.eq(float(src)).all(), (src, x)
            seen[str(src)] = seen.get(str(src), 0) + 1
        pending = [(dist.irecv(x := torch.zeros(3)), x) for _ in range(C.world - 1)]
        for work, x in pending:
            assert work is not None
            work.wait()
            src = work._source_rank()
            assert x.eq(float(src)).all(), (src, x)
            seen[str(src)] = seen.get(str(src), 0) + 1
    else:
        dist.send(torch.full((3,), float(C.rank)), dst=0)
        dist.send(torch.full((3,), float(C.rank)), dst=0)
    dist.barrier(group=C.gloo)
    return seen


@check
def batch_isend_irecv_matches_gloo() -> None:
    def run(group: Any) -> list[torch.Tensor]:
        nxt, prv = (C.rank + 1) % C.world, (C.rank - 1) % C.world
        a, b = torch.zeros(50), torch.zeros(4, dtype=torch.int32)
        ops = [dist.P2POp(dist.irecv, a, prv, group), dist.P2POp(dist.irecv, b, nxt, group),
               dist.P2POp(dist.isend, data((50,), 30), nxt, group),
               dist.P2POp(dist.isend, data((4,), 31, torch.int32), prv, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return [a, b]

    for x, y in zip(run(None), run(C.gloo), strict=True):
        assert_close(x, y, rtol=0, atol=0)


@check
def large_messages_and_subgroups() -> dict[str, Any]:
    """An 8 MB tensor (many datagrams, straight into the receiver's tensor), and
    point-to-point in a group of ranks 0 and 2, where torch speaks global ranks
    and the group group ranks: a receive from any source returns the global one."""
    big = data((2_000_000,), 70)
    got = torch.zeros_like(big)
    nxt, prv = (C.rank + 1) % C.world, (C.rank - 1) % C.world
    works = [dist.irecv(got, src=prv), dist.isend(big, dst=nxt)]
    for w in works:
        assert w is not None
        w.wait()
    g = torch.Generator().manual_seed(70 * 101 + prv)
    assert_close(got, torch.randn((2_000_000,), generator=g), rtol=0, atol=0)
    sub = dist.new_group([0, 2], backend="dlcp")
    seen: dict[str, Any] = {}
    if C.rank == 0:
        x = torch.zeros(3)
        seen["source"] = dist.recv(x, group=sub)
        assert x.eq(2.0).all(), x
        dist.send(torch.full((3,), 7.0), dst=2, group=sub, tag=3)
    elif C.rank == 2:
        dist.send(torch.full((3,), 2.0), dst=0, group=sub)
        y = torch.zeros(3)
        dist.recv(y, src=0, group=sub, tag=3)
        assert y.eq(7.0).all(), y
    dist.barrier(group=C.gloo)
    return seen


@check
def point_to_point_misuse_is_refused() -> dict[str, str]:
    seen = {}
    for name, call in {
        "self": lambda: dist.distributed_c10d._get_default_group().recv(
            [torch.zeros(1)], C.rank, 0),  # (torch's dist.send refuses it before us)
        "tag": lambda: dist.isend(torch.zeros(1), dst=(C.rank + 1) % C.world, tag=1 << 30),
        "peer": lambda: dist.distributed_c10d._get_default_group().send(
            [torch.zeros(1)], C.world + 3, 0),
    }.items():
        try:
            call()
        except ValueError as exc:
            seen[name] = str(exc)
        else:
            raise AssertionError(f"{name}: not refused")
    return seen


# ----------------------------------------------------------------------------- all-to-all


@check
def all_to_all_single_matches_gloo() -> None:
    w = C.world
    # equal splits, 2-D rows
    inp = data((2 * w, 3), 40)
    a, b = torch.zeros(2 * w, 3), torch.zeros(2 * w, 3)
    dist.all_to_all_single(a, inp)
    dist.all_to_all_single(b, inp, group=C.gloo)
    assert_close(a, b, rtol=0, atol=0)
    # uneven: rank r sends q + r + 1 rows to rank q (some zero-sized on purpose)
    ins = [(q + C.rank) % 3 for q in range(w)]
    outs = [(C.rank + q) % 3 for q in range(w)]
    inp = data((sum(ins), 5), 41, torch.int64)
    a, b = torch.zeros(sum(outs), 5, dtype=torch.int64), torch.zeros(sum(outs), 5,
                                                                   dtype=torch.int64)
    dist.all_to_all_single(a, inp, outs, ins)
    dist.all_to_all_single(b, inp, outs, ins, group=C.gloo)
    assert_close(a, b, rtol=0, atol=0)
    work = dist.all_to_all_single(a, inp, outs, ins, async_op=True)
    assert work is not None
    work.wait()
    assert work.is_completed()
    assert_close(a, b, rtol=0, atol=0)


@check
def all_to_all_matches_gloo() -> None:
    ins = [data((3, 2), 50 + q) for q in range(C.world)]
    a, b = [torch.zeros(3, 2) for _ in ins], [torch.zeros(3, 2) for _ in ins]
    dist.all_to_all(a, ins)
    dist.all_to_all(b, ins, group=C.gloo)
    for x, y in zip(a, b, strict=True):
        assert_close(x, y, rtol=0, atol=0)


@check
def all_to_all_with_a_size_per_pair() -> None:
    """Rank r sends r + q + 1 rows to rank q (Gloo refuses sizes that differ)."""

    def rows(src: int, dst: int) -> torch.Tensor:
        return torch.arange((src + dst + 1) * 2, dtype=torch.float64).view(-1, 2) + 100 * src

    outs = [torch.zeros(q + C.rank + 1, 2, dtype=torch.float64) for q in range(C.world)]
    dist.all_to_all(outs, [rows(C.rank, q) for q in range(C.world)])
    for q, got in enumerate(outs):
        assert_close(got, rows(q, C.rank), rtol=0, atol=0)


@check
def all_to_all_misuse_is_refused_and_keeps_ranks_paired() -> str:
    msg = ""
    try:  # splits that do not add up to the output's rows
        bad = [5] * C.world
        dist.all_to_all_single(torch.zeros(C.world), torch.zeros(C.world), bad, [1] * C.world)
    except ValueError as exc:
        msg = str(exc)
    x = torch.ones(3)
    dist.all_reduce(x)  # the ranks still meet
    assert x.eq(C.world).all(), x
    return msg


# ----------------------------------------------------------------------------- sparse


def sparse_grad(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + C.rank)
    idx = torch.randint(0, 20, (1, 8), generator=g)  # duplicates on purpose
    return torch.sparse_coo_tensor(idx, torch.randn(8, 3, generator=g), (20, 3))


@check
def sparse_all_reduce_matches_gloo() -> None:
    a, b = sparse_grad(60), sparse_grad(60)
    dist.all_reduce(a)
    dist.all_reduce(b, group=C.gloo)
    assert_close(a.to_dense(), b.to_dense())


@check
def sparse_all_reduce_of_other_sizes_is_refused() -> str:
    """Rank 0's tensor is (21, 3), the others' (20, 3): every rank is told, as
    Gloo tells it, and the ranks still meet after."""
    size = (21 if C.rank == 0 else 20, 3)
    t = torch.sparse_coo_tensor(torch.zeros((1, 1), dtype=torch.int64), torch.ones(1, 3), size)
    msg = ""
    try:
        dist.all_reduce(t)
    except Exception as exc:  # (the work's error, as the backend raises it)
        msg = str(exc)
    x = torch.ones(3)
    dist.all_reduce(x)
    assert x.eq(C.world).all(), x
    return msg


@check
def ddp_with_sparse_embeddings_matches_gloo() -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(group: Any) -> torch.nn.Module:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.EmbeddingBag(50, 8, mode="sum", sparse=True),
                                    torch.nn.Linear(8, 2))
        ddp = DDP(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(4):
            g = torch.Generator().manual_seed(100 * step + C.rank)
            ids = torch.randint(0, 50, (16, 4), generator=g)
            loss = torch.nn.functional.cross_entropy(
                ddp(ids), torch.randint(0, 2, (16,), generator=g))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return model

    a, b = train(None), train(C.gloo)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert_close(x, y, msg=lambda m, name=name: f"{name}: {m}")
    return {}


# ----------------------------------------------------------------------------- work, timeouts


@check
def work_state_agrees_at_every_moment() -> int:
    """Right after wait() every view says done (is_completed read the chained
    future and lagged in most of 50 operations); a watcher never sees the
    future done while is_completed() says not."""
    lag = 0
    stop = threading.Event()
    works: list[Any] = []

    def watch() -> None:
        nonlocal lag
        while not stop.wait(0.0001):  # (a short pause: spinning would starve the ranks)
            for w in list(works):
                if w.get_future().done() and not w.is_completed():
                    lag += 1

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    for _ in range(50):
        w = dist.all_reduce(torch.ones(10), async_op=True)
        works.append(w)
        w.wait()
        assert w.is_completed() and w.is_success() and w.get_future().done()
        works.pop()
    stop.set()
    t.join()
    assert lag == 0, lag
    return lag


@check
def timeouts_say_timed_out_and_name_peers() -> dict[str, str]:
    short = dist.new_group(backend="dlcp", timeout=datetime.timedelta(seconds=2))
    seen = {}
    if C.rank == 0:
        try:  # nobody else calls it
            dist.all_reduce(torch.ones(3), group=short)
        except Exception as exc:
            seen["all_reduce"] = str(exc)
        try:
            dist.recv(torch.zeros(2), src=1, group=short, tag=5)
        except Exception as exc:
            seen["recv"] = str(exc)
        try:
            dist.barrier(group=short)
        except Exception as exc:
            seen["barrier"] = str(exc)
            seen["barrier_type"] = type(exc).__mro__[1].__name__ + "," + str(
                isinstance(exc, RuntimeError) and isinstance(exc, TimeoutError))
        w = dist.irecv(torch.zeros(2), src=2, tag=4242)  # the default group: 30 s
        try:
            assert w is not None
            w.wait(datetime.timedelta(seconds=0.3))
        except Exception as exc:
            seen["wait"] = str(exc)
    dist.barrier(group=C.gloo)
    if C.rank == 2:  # (the receive above gets its message after all)
        dist.send(torch.zeros(2), dst=0, tag=4242)
    return seen


@check
def monitored_barrier_names_the_ranks_that_did_not_arrive() -> dict[str, str]:
    """All ranks pass it; then rank 2 stays away: rank 0 names it in Gloo's
    words, rank 1 (never answered) names rank 0. Its own group: the absent
    rank's barrier count falls behind."""
    from shims.process_group import dlcp_group

    pg = dlcp_group(dist.new_group(backend="dlcp"))
    pg.monitored_barrier(datetime.timedelta(seconds=10))
    seen = {}
    if C.rank != 2:
        try:
            pg.monitored_barrier(datetime.timedelta(seconds=1), wait_all_ranks=True)
        except Exception as exc:
            seen["error"] = str(exc)
    dist.barrier(group=C.gloo)
    return seen


# ----------------------------------------------------------------------------- main


def main() -> int:
    faulthandler.register(signal.SIGUSR1)  # (kill -USR1 <pid>: every thread's stack)
    torch.set_num_threads(1)
    dist.init_process_group("dlcp", timeout=TIMEOUT)
    C.rank, C.world = dist.get_rank(), dist.get_world_size()
    C.gloo = dist.new_group(backend="gloo", timeout=TIMEOUT)
    results: dict[str, Any] = {}
    only = os.environ.get("PG_WORKER_CHECKS")  # (a comma-separated subset, to debug)
    for name, fn in CHECKS:
        if only and name not in only.split(","):
            continue
        started = time.monotonic()
        print(f"rank {C.rank}: {name}", file=sys.stderr, flush=True)  # (where a hang is)
        try:
            results[name] = {"ok": True, "detail": fn()}
        except Exception as exc:
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()[-3000:]}
            print(f"rank {C.rank}: {name} failed: {exc}", file=sys.stderr, flush=True)
        print(f"rank {C.rank}: {name} took {time.monotonic() - started:.1f} s",
              file=sys.stderr, flush=True)
    dist.barrier(group=C.gloo)
    print("results " + json.dumps({"rank": C.rank, "checks": results}, default=str), flush=True)
    # every check is done and reported: leave without torch's teardown, where the Gloo
    # group of a run whose monitored barrier had timed out aborted a rank once in CI
    # ("terminate called without an active exception", SIGABRT; the DDP benchmark's
    # worker leaves the same way for the same reason). Destroying the group is checked
    # by pg_worker.py (threads_after_destroy) and torch's own harness.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
