"""Ring all-reduce over DLCP: bounded-loss reduce-scatter, reliable all-gather.

The array is cut into ``world_size`` contiguous chunks. In ``world_size - 1``
reduce-scatter steps each rank sends one chunk to its right neighbour and adds
the chunk it gets from its left neighbour; these messages carry the push bound
``p`` (lost elements are filled and reported). Rank ``r`` then owns the fully
reduced chunk ``r + 1``; it divides it by the world size if asked (float16
divides every rank's values first instead, so that the sum cannot overflow:
:func:`~dlcp.collectives.comm.divide_first`), and the
all-gather passes every owned chunk around the ring with the gather bound
(default 0: retransmit until everything arrived). Because each reduced chunk is
computed once and copied bit for bit, every replica ends with identical bytes,
whatever the reduce-scatter lost.

A gather bound above 0 (at most ``p``) trades that away: a rank whose copy of
a reduced chunk misses elements keeps what its buffer held there
(previous-value fill), and so does every rank it forwards the copy to, so
replicas differ by those elements. They are counted as lost in the report,
like the reduce-scatter's. What the buffer holds is made this rank's estimate
first: after the reduce-scatter its chunk ``j`` is the sum of ``d + 1`` ranks'
values (``d = (r - j) mod n``), scaled to their mean (and times ``n`` for a
sum), so a lost element is off by sampling, not by a factor.
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from ..proto.config import FillPolicy
from .comm import (
    CollectiveReport,
    Communicator,
    ReportBuilder,
    Segments,
    cancel_all,
    check_reduce_fill,
    copy_fill,
    divide_first,
)

__all__ = ["SendTracker", "check_allreduce", "chunk_bounds", "exchange", "ring_allreduce"]

_GATHER_ROLE = 2048
SUPPORTED = (np.float32, np.float16)


def chunk_bounds(n_elems: int, parts: int) -> list[int]:
    """Element boundaries of ``parts`` near-equal contiguous chunks."""
    return [n_elems * i // parts for i in range(parts + 1)]


def check_array(data: npt.NDArray[Any], op: str) -> None:
    if data.ndim != 1 or not data.flags.c_contiguous:
        raise UsageError(f"{op} needs a contiguous 1-D array, got shape {data.shape}")
    if data.dtype not in SUPPORTED:
        raise UsageError(f"{op} reduces float32 or float16 arrays, got {data.dtype}")


def check_allreduce(
    data: npt.NDArray[Any], op: str, *, fill: FillPolicy, p: float, p_gather: float
) -> None:
    """What every bounded-loss all-reduce refuses: an array it cannot reduce, a
    previous-value fill of its reduce phase, a gather bound looser than ``p``."""
    check_array(data, op)
    check_reduce_fill(fill, op)
    if p_gather > p:
        raise UsageError(f"p_gather={p_gather} must not exceed p={p} (a stricter bound)")


def ring_allreduce(
    comm: Communicator,
    data: npt.NDArray[Any],
    *,
    segments: Segments | None = None,
    p: float = 0.0,
    p_gather: float = 0.0,
    fill: FillPolicy = FillPolicy.ZERO,
    average: bool = False,
) -> CollectiveReport:
    """Sum (or average) ``data`` across the ring, in place."""
    call = comm.next_call()  # first: a call this rank refuses still takes its number
    check_allreduce(data, "ring_allreduce", fill=fill, p=p, p_gather=p_gather)
    n, r = comm.world_size, comm.rank
    average = divide_first(data, n, average)
    report = ReportBuilder("ring_allreduce", call, len(data))
    if n == 1 or len(data) == 0:  # (an empty array: every rank's is, nothing to move)
        return report.build()
    bounds = chunk_bounds(len(data), n)
    scratch = np.empty(max(b - a for a, b in itertools.pairwise(bounds)), data.dtype)

    def chunk(i: int) -> tuple[int, int]:
        return bounds[i], bounds[i + 1]

    right, left = (r + 1) % n, (r - 1) % n
    # send futures: waited for at the end, not step by step; cancelled if the call fails
    with SendTracker() as sends:
        for s in range(n - 1):  # reduce-scatter: add what the left neighbour sends
            (sa, sb), (ra, rb) = chunk((r - s) % n), chunk((r - s - 1) % n)
            if exchange(
                comm,
                data,
                (sa, sb),
                scratch[: rb - ra],
                to=right,
                src=left,
                call=call,
                role=s,
                p=p,
                fill=fill,
                segments=segments,
                report=report,
                sends=sends,
            ):
                data[ra:rb] += scratch[: rb - ra]

        oa, ob = chunk((r + 1) % n)
        if average:
            data[oa:ob] /= data.dtype.type(n)
        if p_gather > 0:  # what a lost all-gather element keeps: this rank's estimate
            for j in range(n):
                held = (r - j) % n + 1  # ranks whose values chunk j sums here
                if held < n:
                    a, b = chunk(j)
                    data[a:b] *= data.dtype.type((1 if average else n) / held)
        for s in range(n - 1):  # all-gather: pass every reduced chunk around
            (sa, sb), (ra, rb) = chunk((r + 1 - s) % n), chunk((r - s) % n)
            exchange(
                comm,
                data,
                (sa, sb),
                data[ra:rb],
                to=right,
                src=left,
                call=call,
                role=_GATHER_ROLE + s,
                p=p_gather,
                fill=copy_fill(p_gather),
                segments=segments,
                report=report,
                sends=sends,
            )
        sends.wait(comm, report, data.itemsize)
    return report.build()


def exchange(
    comm: Communicator,
    data: npt.NDArray[Any],
    send: tuple[int, int],
    recv_into: npt.NDArray[Any],
    *,
    to: int,
    src: int,
    call: int,
    role: int,
    p: float,
    fill: FillPolicy,
    segments: Segments | None,
    report: ReportBuilder,
    sends: SendTracker,
) -> bool:
    """One step of a collective: ``data[send]`` to rank ``to`` while ``recv_into``
    is filled from rank ``src`` (a ring's right and left neighbours, a
    halving-doubling pair's partner both). An empty range or buffer (fewer
    elements than ranks) is neither sent nor received. True if something was
    received.

    The send's future goes to ``sends`` instead of being waited for: waiting for
    the receiver's STOP here would add a control round trip to every step. That
    is safe because ``Endpoint.send`` copies a send's bytes into packets before
    it returns, and no later step writes a chunk this rank has sent until the
    all-gather receives into it: a receive posted after that send. The caller
    waits for all of them before returning."""
    incoming = (
        comm.recv(recv_into, src=src, call=call, role=role, p=p, fill=fill)
        if len(recv_into)
        else None
    )
    sa, sb = send
    try:
        if sa < sb:
            sends.add(
                comm.send_part(data, sa, sb, to=to, call=call, role=role, segments=segments, p=p)
            )
        sends.raise_first_failure()
    except BaseException:
        if incoming is not None:
            incoming.cancel()  # the endpoint forgets it (and tells its sender)
        raise
    if incoming is not None:
        try:
            report.received(sends.await_receive(comm, incoming), bounded=p > 0)
        except BaseException:  # (an interrupt, say) the receive must not write later
            incoming.cancel()  # (a no-op if it failed, or a failed send cancelled it)
            raise
    return incoming is not None


class SendTracker:
    """The send futures of one collective call, waited for at its end. A send
    that fails is recorded by its done-callback when it fails, so checking for
    one between steps takes no lock (a ``done()`` per future per step did). As a
    context manager it cancels them all if the call fails (else they would
    retransmit until the endpoint's timeout)."""

    __slots__ = ("_failed", "_watched", "futures")

    def __init__(self) -> None:
        self.futures: list[Future[Any]] = []
        self._failed: list[BaseException] = []
        self._watched: Future[Any] | None = None

    def __enter__(self) -> SendTracker:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:  # the call failed: its sends stop (their receivers are told)
            cancel_all(self.futures)

    def add(self, fut: Future[Any]) -> None:
        self.futures.append(fut)
        fut.add_done_callback(self._settled)

    def _settled(self, fut: Future[Any]) -> None:
        if not fut.cancelled() and (exc := fut.exception()) is not None:
            self._failed.append(exc)  # list.append: atomic, from any thread
            watched = self._watched
            if watched is not None:  # the call has failed: its step stops waiting
                watched.cancel()

    def raise_first_failure(self) -> None:
        """Raise the error of the first send that failed, if one did."""
        if self._failed:
            raise self._failed[0]

    def await_receive(self, comm: Communicator, incoming: Future[Any]) -> Any:
        """``comm.wait(incoming)``, ended as soon as a send of this call fails:
        that cancels the receive, and the send's error is raised. Else the wait
        would last the receive's whole timeout, for the rank it comes from may
        be alive and never send (it waits for this one further round the ring).
        A peer that went away often takes another with it: a failed send is
        named before the receive's own failure, as the first this rank saw."""
        self._watched = incoming
        try:
            if self._failed:  # (checked after watching: none can slip between)
                incoming.cancel()
            return comm.wait(incoming)
        except Exception:
            self.raise_first_failure()
            raise
        finally:
            self._watched = None

    def wait(self, comm: Communicator, report: ReportBuilder, itemsize: int) -> None:
        """Wait for every send, in order, into ``report``."""
        for fut in self.futures:
            report.sent(comm.wait(fut), itemsize)
