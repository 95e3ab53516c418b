"""Parameter server over DLCP: push shards with the push bound, pull with the pull bound.

The array is cut into one contiguous shard per server. Every worker pushes
shard ``i`` to server ``i`` (bounded loss: lost elements are filled and
reported); each server sums what its workers pushed, divides by the number of
workers if asked, and every worker pulls every shard back (default bound 0:
reliable, so every worker ends with identical bytes). With a pull bound above
0, a pulled element that is lost keeps this worker's own value there, its
estimate of the result (times the number of workers for a sum).

Servers are either co-located (a worker that also serves a shard: with every
rank a server this is a "PS-style all-reduce") or dedicated (a rank that holds
no data of its own and calls :func:`ps_serve` once per step; it learns the
shard size from the self-describing packets).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from ..io.endpoint import Received
from ..proto.config import FillPolicy
from .comm import (
    CollectiveReport,
    Communicator,
    ReportBuilder,
    Segments,
    averages_by_dividing_first,
    cancel_all,
    check_reduce_fill,
    copy_fill,
    divide_first,
)
from .ring import SendTracker, check_array, chunk_bounds

__all__ = ["check_roles", "ps_allreduce", "ps_serve"]

PUSH, PULL = 4000, 4001


def check_roles(
    world_size: int, servers: Sequence[int] | None, workers: Sequence[int] | None
) -> tuple[list[int], list[int]]:
    """The server and worker ranks (None: every rank), checked: distinct ranks of
    the world, at least one of each, and every rank one or the other."""
    everyone = list(range(world_size))
    s = list(servers) if servers is not None else everyone
    w = list(workers) if workers is not None else everyone
    for name, ranks in (("servers", s), ("workers", w)):
        if not ranks or len(set(ranks)) != len(ranks) or not set(ranks) <= set(everyone):
            raise UsageError(f"{name}={ranks} must be distinct ranks of 0..{world_size - 1}")
    if not set(everyone) <= set(s) | set(w):
        raise UsageError(f"every rank must be a server or a worker (servers={s}, workers={w})")
    return s, w


def ps_allreduce(
    comm: Communicator,
    data: npt.NDArray[Any],
    *,
    servers: Sequence[int] | None = None,
    workers: Sequence[int] | None = None,
    segments: Segments | None = None,
    p_push: float = 0.0,
    p_pull: float = 0.0,
    fill: FillPolicy = FillPolicy.ZERO,
    average: bool = False,
) -> CollectiveReport:
    """A worker's step: push ``data``'s shards, pull the aggregate back into ``data``.
    A rank that is both worker and server also aggregates its own shard."""
    # first: a call this rank refuses still takes its number (a dedicated server,
    # which cannot see why, took its own: later calls stay paired)
    call = comm.next_call()
    check_array(data, "ps_allreduce")
    check_reduce_fill(fill, "ps_allreduce")
    srv, wrk = check_roles(comm.world_size, servers, workers)
    r = comm.rank
    if r not in wrk:
        raise UsageError(f"rank {r} is not a worker; a dedicated server calls ps_serve")
    bounds = chunk_bounds(len(data), len(srv))
    empty = [s for i, s in enumerate(srv) if s not in wrk and bounds[i] == bounds[i + 1]]
    if empty:
        # a dedicated server learns its shard from the pushes: it would wait for ever
        raise UsageError(
            f"{len(data)} elements for {len(srv)} servers leave dedicated server(s) "
            f"{empty} an empty shard"
        )
    average = divide_first(data, len(wrk), average)  # (a dedicated server knows by the type)
    report = ReportBuilder("ps_allreduce", call, len(data))
    sends = SendTracker()  # pushes, and a co-located server's pulls
    pull_fill = copy_fill(p_pull)
    incoming: list[Future[Received]] = []
    try:
        for i, server in enumerate(srv):
            a, b = bounds[i], bounds[i + 1]
            if server != r and a < b:  # fewer elements than servers: empty shards move nothing
                sends.add(comm.send_part(data, a, b, to=server, call=call, role=PUSH,
                                         segments=segments, p=p_push))  # fmt: skip
        if p_pull > 0 and not average:  # (the pushes have copied their bytes already)
            for i, server in enumerate(srv):
                if server != r:  # a lost pulled element keeps this worker's estimate of the sum
                    data[bounds[i] : bounds[i + 1]] *= data.dtype.type(len(wrk))
        for i, server in enumerate(srv):
            if server != r and bounds[i] < bounds[i + 1]:
                incoming.append(
                    comm.recv(
                        data[bounds[i] : bounds[i + 1]],
                        src=server,
                        call=call,
                        role=PULL,
                        p=p_pull,
                        fill=pull_fill,
                    )
                )
        i = srv.index(r) if r in srv else -1
        if i >= 0 and bounds[i] < bounds[i + 1]:  # co-located server: aggregate, serve back
            a, b = bounds[i], bounds[i + 1]
            _aggregate(
                comm,
                data[a:b],
                [w for w in wrk if w != r],
                call,
                report,
                p_push=p_push,
                fill=fill,
                divide=len(wrk) if average else 0,
            )
            for w in wrk:
                if w != r:
                    sends.add(comm.send_part(data, a, b, to=w, call=call, role=PULL,
                                             segments=segments, p=p_pull))  # fmt: skip
        for fut in incoming:  # (a failed push ends the wait: the call has failed)
            report.received(sends.await_receive(comm, fut), bounded=p_pull > 0)
        sends.wait(comm, report, data.itemsize)
    except BaseException:
        # the pulls write into ``data``: not after this raised; the pushes stop
        cancel_all([*incoming, *sends.futures])
        raise
    return report.build()


def ps_serve(
    comm: Communicator,
    *,
    servers: Sequence[int],
    workers: Sequence[int],
    segments: Segments | None = None,
    p_push: float = 0.0,
    p_pull: float = 0.0,
    fill: FillPolicy = FillPolicy.ZERO,
    average: bool = False,
) -> CollectiveReport:
    """A dedicated server's step: receive a shard from every worker, sum, send it back.
    Shapes come from the packets; the first worker's message sets them. ``segments``
    (offset, length, layer) of the shard's layers, offsets from the shard's start,
    give the pulls their classes (without them a pull is one class)."""
    call = comm.next_call()  # first: a call this rank refuses still takes its number
    check_reduce_fill(fill, "ps_serve")
    srv, wrk = check_roles(comm.world_size, servers, workers)
    r = comm.rank
    if r in wrk or r not in srv:
        raise UsageError(f"rank {r} is not a dedicated server (servers={srv}, workers={wrk})")
    report = ReportBuilder("ps_serve", call, 0)  # (its clock runs from here; size below)
    futs: list[Future[Any]] = []
    try:
        for w in wrk:
            futs.append(
                comm.endpoint.recv(src=w, step=call, msg=comm.msg_id(PUSH), p=p_push, fill=fill)
            )
        return _serve_shards(comm, futs, wrk, call, report, p_push=p_push, p_pull=p_pull,
                             segments=segments, average=average)  # fmt: skip
    except BaseException:  # nothing of the call stays behind in the endpoint
        cancel_all(futs)
        raise


def _serve_shards(
    comm: Communicator,
    futs: list[Future[Any]],
    wrk: Sequence[int],
    call: int,
    report: ReportBuilder,
    *,
    p_push: float,
    p_pull: float,
    segments: Segments | None,
    average: bool,
) -> CollectiveReport:
    r = comm.rank
    got: list[Received] = [comm.wait(f) for f in futs]
    shapes = {g.data.shape for g in got} | {g.data.dtype.str for g in got}
    if len(shapes) != 2:
        raise UsageError(
            f"rank {r}: workers pushed shards of different shapes or dtypes: "
            f"{[(g.src, g.data.dtype, g.data.shape) for g in got]}"
        )
    # (the first push's own buffer, handed to this call by the endpoint, holds the sum)
    total = got[0].data
    for g in got[1:]:
        total += g.data
    if average and not averages_by_dividing_first(total.dtype):  # (else the workers did)
        total /= total.dtype.type(len(wrk))
    report.elems = len(total)
    for g in got:
        report.received(g, bounded=p_push > 0)
    sends: list[Future[Any]] = []
    try:
        for w in wrk:
            sends.append(comm.send(total, to=w, call=call, role=PULL, segments=segments, p=p_pull))
        for fut in sends:
            report.sent(comm.wait(fut), total.itemsize)
    except BaseException:
        cancel_all(sends)
        raise
    return report.build()


def _aggregate(
    comm: Communicator,
    shard: npt.NDArray[Any],
    others: list[int],
    call: int,
    report: ReportBuilder,
    *,
    p_push: float,
    fill: FillPolicy,
    divide: int,
) -> None:
    # float32 pushes whose lost elements add nothing are added into the shard as
    # their chunks arrive (in arrival order); the others land in buffers first
    # and are added in the workers' order
    added = shard.dtype == np.float32 and fill is FillPolicy.ZERO
    buffers = [shard if added else np.empty_like(shard) for _ in others]
    futs: list[Future[Any]] = []
    try:
        # posted in the try: a later recv that raises (a worker without an
        # address) must not leave the earlier ones posted, taking pushes
        for buf, w in zip(buffers, others, strict=True):
            futs.append(comm.recv(buf, src=w, call=call, role=PUSH, p=p_push, fill=fill,
                                  accumulate=added))  # fmt: skip
        for fut, buf in zip(futs, buffers, strict=True):
            report.received(comm.wait(fut), bounded=p_push > 0)
            if not added:
                shard += buf
    except BaseException:  # nothing of the call stays behind in the endpoint
        cancel_all(futs)
        raise
    if divide:
        shard /= shard.dtype.type(divide)
