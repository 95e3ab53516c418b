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

Where some worker serves no shard, a co-located server's shard moves in
pieces (:func:`piece_bounds`: about ``piece_bytes`` each, at most
:data:`MAX_PIECES`), each push and pull of a piece its own message: the server
sends a piece's aggregate back as soon as every worker's push of that piece is
in, so its link carries the first pulls while the later pushes still arrive.
With whole shards a server's link runs one direction at a time: pushes in, then
pulls out (incast). Where every worker serves a shard, each rank's link already
carries its pushes out while its shard's pushes come in, and its pulls out while
the others' come back, so pieces would only add messages: shards move whole
(measured in ``docs/results/2026-12-04/ps_pieces/``). Every worker cuts a shard
the same way from its length. A dedicated server learns its shard only from the
pushes, so its shards move whole.
"""

from __future__ import annotations

import itertools
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

__all__ = [
    "MAX_PIECES",
    "PIECE_BYTES",
    "check_piece_bytes",
    "check_roles",
    "piece_bounds",
    "ps_allreduce",
    "ps_serve",
]

#: roles of the push and the pull of piece k of a shard: PUSH + k and PULL + k
PUSH, PULL = 0, 2048
#: a co-located server's shard is cut into pieces of at least this many bytes
#: (``piece_bytes`` where some worker serves no shard) ...
PIECE_BYTES = 256 * 1024
#: ... and at most this many pieces
MAX_PIECES = 8


def piece_bounds(a: int, b: int, itemsize: int, piece_bytes: int) -> list[int]:
    """Element boundaries of the pieces shard ``[a, b)`` moves in: near-equal
    pieces of at least ``piece_bytes`` (one, if the shard is smaller), at most
    :data:`MAX_PIECES`; ``piece_bytes=0``: the whole shard as one piece."""
    pieces = 1 if piece_bytes == 0 else (b - a) * itemsize // piece_bytes
    return [a + x for x in chunk_bounds(b - a, max(1, min(MAX_PIECES, pieces)))]


def check_piece_bytes(piece_bytes: object, who: str = "") -> None:
    """Refuse a ``piece_bytes`` that is not an int >= 0, naming it (``who``: a
    prefix saying whose setting it is)."""
    if type(piece_bytes) is not int or piece_bytes < 0:
        raise UsageError(f"{who}piece_bytes={piece_bytes!r} must be an int >= 0 (0: whole shards)")


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
    piece_bytes: int | None = None,
) -> CollectiveReport:
    """A worker's step: push ``data``'s shards, pull the aggregate back into ``data``.
    A rank that is both worker and server also aggregates its own shard.
    ``piece_bytes``: the pieces a co-located server's shard moves in (module
    doc; 0: whole shards; None: :data:`PIECE_BYTES` where some worker serves
    no shard, else 0); every rank of the call must pass the same."""
    # first: a call this rank refuses still takes its number (a dedicated server,
    # which cannot see why, took its own: later calls stay paired)
    call = comm.next_call()
    check_array(data, "ps_allreduce")
    check_reduce_fill(fill, "ps_allreduce")
    if piece_bytes is not None:
        check_piece_bytes(piece_bytes)
    srv, wrk = check_roles(comm.world_size, servers, workers)
    if piece_bytes is None:
        piece_bytes = 0 if set(wrk) <= set(srv) else PIECE_BYTES
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
    # each shard's pieces: a dedicated server's shard is one
    pieces = [
        piece_bounds(bounds[i], bounds[i + 1], data.itemsize, piece_bytes if s in wrk else 0)
        for i, s in enumerate(srv)
    ]
    incoming: list[Future[Received]] = []
    try:
        for i, server in enumerate(srv):
            if server != r and bounds[i] < bounds[i + 1]:  # (empty shards move nothing)
                for k, (a, b) in enumerate(itertools.pairwise(pieces[i])):
                    sends.add(comm.send_part(data, a, b, to=server, call=call, role=PUSH + k,
                                             segments=segments, p=p_push))  # fmt: skip
        if p_pull > 0 and not average:  # (the pushes have copied their bytes already)
            for i, server in enumerate(srv):
                if server != r:  # a lost pulled element keeps this worker's estimate of the sum
                    data[bounds[i] : bounds[i + 1]] *= data.dtype.type(len(wrk))
        for i, server in enumerate(srv):
            if server != r and bounds[i] < bounds[i + 1]:
                for k, (a, b) in enumerate(itertools.pairwise(pieces[i])):
                    incoming.append(comm.recv(data[a:b], src=server, call=call, role=PULL + k,
                                              p=p_pull, fill=pull_fill))  # fmt: skip
        i = srv.index(r) if r in srv else -1
        if i >= 0 and bounds[i] < bounds[i + 1]:  # co-located server: aggregate, serve back
            _serve_pieces(
                comm,
                data,
                pieces[i],
                [w for w in wrk if w != r],
                call,
                report,
                sends,
                segments=segments,
                p_push=p_push,
                p_pull=p_pull,
                fill=fill,
                divide=len(wrk) if average else 0,
            )
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


def _serve_pieces(
    comm: Communicator,
    data: npt.NDArray[Any],
    pieces: list[int],
    others: list[int],
    call: int,
    report: ReportBuilder,
    sends: SendTracker,
    *,
    segments: Segments | None,
    p_push: float,
    p_pull: float,
    fill: FillPolicy,
    divide: int,
) -> None:
    """A co-located server's shard, ``data[pieces[0]:pieces[-1]]``: every piece's
    pushes received into it and aggregated, and each piece sent back to the
    other workers as soon as all of theirs are in (in piece order)."""
    # float32 pushes whose lost elements add nothing are added into the shard as
    # their chunks arrive (in arrival order); the others land in buffers first
    # and are added in the workers' order
    a0 = pieces[0]
    shard = data[a0 : pieces[-1]]
    added = shard.dtype == np.float32 and fill is FillPolicy.ZERO
    buffers = [shard if added else np.empty_like(shard) for _ in others]
    futs: list[list[Future[Any]]] = []  # per piece, one per other worker
    try:
        # posted in the try: a later recv that raises (a worker without an
        # address) must not leave the earlier ones posted, taking pushes
        for k, (a, b) in enumerate(itertools.pairwise(pieces)):
            futs.append([])
            for buf, w in zip(buffers, others, strict=True):
                futs[k].append(comm.recv(buf[a - a0 : b - a0], src=w, call=call, role=PUSH + k,
                                         p=p_push, fill=fill, accumulate=added))  # fmt: skip
        for k, (a, b) in enumerate(itertools.pairwise(pieces)):
            for fut in futs[k]:
                report.received(sends.await_receive(comm, fut), bounded=p_push > 0)
            piece = data[a:b]
            if not added:
                for buf in buffers:
                    piece += buf[a - a0 : b - a0]
            if divide:
                piece /= piece.dtype.type(divide)
            for w in others:
                sends.add(comm.send_part(data, a, b, to=w, call=call, role=PULL + k,
                                         segments=segments, p=p_pull))  # fmt: skip
    except BaseException:  # nothing of the call stays behind in the endpoint
        cancel_all([f for piece_futs in futs for f in piece_futs])
        raise
