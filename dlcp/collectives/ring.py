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
from collections.abc import Callable
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
    cancel_all,
    check_reduce_fill,
    copy_fill,
    divide_first,
)

__all__ = [
    "PostedReceives",
    "SendTracker",
    "check_allreduce",
    "chunk_bounds",
    "exchange",
    "ring_allreduce",
]

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

    def chunk(i: int) -> tuple[int, int]:
        return bounds[i], bounds[i + 1]

    right, left = (r + 1) % n, (r - 1) % n
    widest = max(b - a for a, b in itertools.pairwise(bounds))
    # sends read their bytes from data while they last (no copy into packets):
    # a chunk sent is written next by the all-gather's receive, which the
    # ring brings only after the right neighbour completed the message that
    # chunk went in (later datagrams of it are late there), or by the rescaling
    # below of a lossy all-gather, which may come first: then they are copied
    lend = p_gather == 0
    # send futures: waited for at the end, not step by step; cancelled if the call fails
    with SendTracker() as sends, PostedReceives(comm, call=call, src=left) as incoming:
        scratch = incoming.scratch(data.dtype, (n - 1) * widest)
        for s in range(n - 1):  # reduce-scatter step s: into a scratch row of its own
            ra, rb = chunk((r - s - 1) % n)
            incoming.post(scratch[s * widest : s * widest + rb - ra], role=s, p=p, fill=fill)
        if p_gather == 0:  # (else the gather's buffers are rescaled first, below)
            _post_gather(incoming, data, chunk, n, r, 0.0)
        for s in range(n - 1):  # reduce-scatter: add what the left neighbour sends
            (sa, sb), (ra, rb) = chunk((r - s) % n), chunk((r - s - 1) % n)
            if exchange(
                comm, data, (sa, sb), incoming.take(s), to=right, call=call, role=s, p=p,
                segments=segments, report=report, sends=sends, borrow=lend,
            ):  # fmt: skip
                data[ra:rb] += scratch[s * widest : s * widest + rb - ra]

        oa, ob = chunk((r + 1) % n)
        if average:
            data[oa:ob] /= data.dtype.type(n)
        if p_gather > 0:  # what a lost all-gather element keeps: this rank's estimate
            for j in range(n):
                held = (r - j) % n + 1  # ranks whose values chunk j sums here
                if held < n:
                    a, b = chunk(j)
                    data[a:b] *= data.dtype.type((1 if average else n) / held)
            _post_gather(incoming, data, chunk, n, r, p_gather)
        for s in range(n - 1):  # all-gather: pass every reduced chunk around
            role = _GATHER_ROLE + s
            exchange(
                comm, data, chunk((r + 1 - s) % n), incoming.take(role), to=right, call=call,
                role=role, p=p_gather, segments=segments, report=report, sends=sends,
                borrow=lend,
            )  # fmt: skip
        sends.wait(comm, report, data.itemsize)
    return report.build()


def _post_gather(
    incoming: PostedReceives,
    data: npt.NDArray[Any],
    chunk: Callable[[int], tuple[int, int]],
    n: int,
    r: int,
    p_gather: float,
) -> None:
    """Post the all-gather's receives: step ``s`` brings chunk ``r - s`` into
    place. Early is safe: that chunk's reduced value comes round only after this
    rank sent its own part of it (step ``s`` of the reduce-scatter, whose bytes
    the endpoint copied when it was posted), and nothing reads it after that."""
    fill = copy_fill(p_gather)
    for s in range(n - 1):
        ra, rb = chunk((r - s) % n)
        incoming.post(data[ra:rb], role=_GATHER_ROLE + s, p=p_gather, fill=fill)


class PostedReceives:
    """The receives of one collective call, posted before its first send.

    A message whose first datagram comes before its receive is posted is kept in
    a buffer of the endpoint's and copied once more when the receive comes: in a
    4-rank ring on two cores a quarter to a third of the messages did, a third
    more copying than the UDP floor, which places every datagram where it goes.
    Posted up front, DLCP's go straight to their place too. Each receive's
    timeout counts from the call's start.

    As a context manager it cancels the receives the call did not take, if the
    call fails (none may write into the caller's memory after the call raised),
    and gives the call's scratch back to the communicator if it succeeded."""

    __slots__ = ("_call", "_comm", "_pending", "_scratch", "_src")

    def __init__(self, comm: Communicator, *, call: int, src: int | None = None) -> None:
        self._comm = comm
        self._src = src  # the peer of every receive, unless a post names another
        self._call = call
        self._pending: dict[tuple[int, int], Future[Received]] = {}
        self._scratch: npt.NDArray[np.uint8] | None = None

    def __enter__(self) -> PostedReceives:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            cancel_all(list(self._pending.values()))
        elif self._scratch is not None:
            self._comm.give_back_scratch(self._scratch)
        self._pending.clear()
        self._scratch = None

    def scratch(self, dtype: np.dtype[Any], elems: int) -> npt.NDArray[Any]:
        """``elems`` elements of ``dtype`` for the call's own use (one per call)."""
        assert self._scratch is None, "one scratch per call"
        self._scratch = self._comm.take_scratch(elems * dtype.itemsize)
        return self._scratch[: elems * dtype.itemsize].view(dtype)

    def _peer(self, src: int | None) -> int:
        peer = src if src is not None else self._src
        assert peer is not None, "a receive needs its peer"
        return peer

    def post(
        self,
        out: npt.NDArray[Any],
        *,
        role: int,
        p: float,
        fill: FillPolicy,
        src: int | None = None,
    ) -> None:
        """Receive message ``role`` from ``src`` into ``out`` (nothing if ``out``
        is empty: a chunk of no elements is neither sent nor received)."""
        if len(out):
            peer = self._peer(src)
            self._pending[peer, role] = self._comm.recv(
                out, src=peer, call=self._call, role=role, p=p, fill=fill
            )

    def take(self, role: int, *, src: int | None = None) -> Future[Received] | None:
        """The receive of message ``role`` (None if nothing was posted for it)."""
        return self._pending.pop((self._peer(src), role), None)


def exchange(
    comm: Communicator,
    data: npt.NDArray[Any],
    send: tuple[int, int],
    incoming: Future[Received] | None,
    *,
    to: int,
    call: int,
    role: int,
    p: float,
    segments: Segments | None,
    report: ReportBuilder,
    sends: SendTracker,
    borrow: bool = False,
) -> bool:
    """One step of a collective: ``data[send]`` to rank ``to``, then wait for
    ``incoming``, the step's receive, posted earlier (a ring's left neighbour, a
    halving-doubling pair's partner). An empty range is not sent; a step with
    nothing to receive has no ``incoming``. True if something was received.

    The send's future goes to ``sends`` instead of being waited for: waiting for
    the receiver's STOP here would add a control round trip to every step. That
    is safe because ``Endpoint.send`` copies a send's bytes into packets before
    it returns, or, with ``borrow`` (the engine reads them from ``data`` as long
    as the message lasts), because the caller writes a range it sent only once
    the receiver has completed that message. The caller waits for all of them
    before returning."""
    sa, sb = send
    try:
        if sa < sb:
            part = comm.send_part(
                data, sa, sb, to=to, call=call, role=role, segments=segments, p=p, borrow=borrow
            )
            sends.add(part)
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
