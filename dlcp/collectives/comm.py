"""Communicator: a group of ranks that call collectives in the same order.

Every collective call takes the next call number of its communicator; every
rank makes the same calls in the same order (as with NCCL or Gloo), so the call
number identifies the same call everywhere and becomes the messages' ``step``.
The ``msg`` field carries the communicator's channel (high 4 bits) and the
message's role inside the call (low 12 bits), so several communicators can
share one endpoint without their messages meeting.

The call numbers belong to the endpoint and channel, not to one communicator
object: a communicator made later on the same endpoint and channel (a DDP hook
state re-created after a restore, say) continues the numbering where the
earlier one stopped, so its calls never reuse the message ids of calls the
peers have already completed. One communicator at a time draws them: a second
one on a channel whose first is still alive (not closed, not collected) is
refused.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, PeerTimeout, UsageError, UsageStateError
from ..io.endpoint import Endpoint, Received
from ..proto.config import FillPolicy
from ..proto.loss_report import N_CLASSES
from ..proto.session import SendReport

__all__ = [
    "CollectiveReport",
    "Communicator",
    "ReportBuilder",
    "Segments",
    "cancel_all",
    "check_reduce_fill",
    "copy_fill",
    "slice_segments",
]

Segments = Sequence[tuple[int, int, int]]  # (offset, length, layer) in elements
MAX_ROLE = 0x0FFF
MAX_CHANNEL = 0x0F
#: ranks a communicator serves: a ring's all-gather steps take roles 2048 + s,
#: s < world_size - 1, and every role must fit MAX_ROLE
MAX_WORLD = 2048


@dataclass(frozen=True, slots=True)
class CollectiveReport:
    """What one collective call cost and lost, as seen by this rank."""

    op: str
    call: int
    elems: int
    bytes_sent: int
    bytes_received: int
    #: elements of incoming messages that were filled instead of received
    lost_elems: int
    #: lost_elems / elements received by this rank in bounded-loss phases
    lost_fraction: float
    #: lost chunks per (priority, drop) class, index prio * 2 + drop
    lost_chunks: tuple[int, ...]
    #: chunks of each class that incoming messages carried (received or lost)
    class_chunks: tuple[int, ...]
    retransmitted_packets: int
    nack_rounds: int
    seconds: float
    #: elements of incoming messages in bounded-loss phases (lost_fraction's divisor)
    bounded_elems: int = 0

    @property
    def lost_fraction_per_class(self) -> tuple[float, ...]:
        """Per (priority, drop) class, index prio * 2 + drop: the share of that
        class's incoming chunks that were lost (0.0 for a class with none)."""
        return tuple(
            lost / total if total else 0.0
            for lost, total in zip(self.lost_chunks, self.class_chunks, strict=True)
        )


@dataclass(slots=True)
class ReportBuilder:
    op: str
    call: int
    elems: int
    started: float = field(default_factory=time.perf_counter)
    bytes_sent: int = 0
    bytes_received: int = 0
    lost_elems: int = 0
    bounded_elems: int = 0
    #: per received message, its per-class (lost, received) chunk counts: summed
    #: once in :meth:`build` (cheaper than array arithmetic per message)
    chunk_counts: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    retransmitted: int = 0
    nack_rounds: int = 0

    def sent(self, report: SendReport, itemsize: int) -> None:
        self.bytes_sent += report.msg_elems * itemsize
        self.retransmitted += report.retransmitted_packets

    def received(self, got: Received, *, bounded: bool) -> None:
        r = got.report
        self.bytes_received += r.msg_elems * got.data.itemsize
        self.lost_elems += r.lost_elems
        if bounded:
            self.bounded_elems += r.msg_elems
        self.chunk_counts.append((r.lost_chunks, r.received_chunks))
        self.nack_rounds += r.nack_rounds

    def build(self) -> CollectiveReport:
        lost = [0] * N_CLASSES
        total = [0] * N_CLASSES
        for lost_c, received_c in self.chunk_counts:  # (map adds the 16 classes in C)
            if len(lost_c) != N_CLASSES or len(received_c) != N_CLASSES:
                raise ValueError(f"a report of {len(lost_c)} / {len(received_c)} classes")
            lost = list(map(operator.add, lost, lost_c))
            total = list(map(operator.add, total, map(operator.add, lost_c, received_c)))
        return CollectiveReport(
            op=self.op,
            call=self.call,
            elems=self.elems,
            bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received,
            lost_elems=self.lost_elems,
            lost_fraction=self.lost_elems / self.bounded_elems if self.bounded_elems else 0.0,
            lost_chunks=tuple(lost),
            class_chunks=tuple(total),
            retransmitted_packets=self.retransmitted,
            nack_rounds=self.nack_rounds,
            seconds=time.perf_counter() - self.started,
            bounded_elems=self.bounded_elems,
        )


def copy_fill(p: float) -> FillPolicy:
    """Fill for phases that hand out finished values (all-gather, pull): with a loss
    bound, keep what the buffer held; exact (p = 0) phases never fill."""
    return FillPolicy.PREVIOUS if p > 0 else FillPolicy.ZERO


def averages_by_dividing_first(dtype: Any) -> bool:
    """Whether an average of ``dtype`` divides each rank's values before the sum
    (float16, as torch's default DDP hook does: summed first, the values of a
    few ranks overflow float16's 65504 where their mean does not)."""
    return bool(np.dtype(dtype) == np.float16)


def divide_first(data: npt.NDArray[Any], parts: int, average: bool) -> bool:
    """Divide ``data`` by ``parts`` (the ranks averaged over) now, if its type
    averages that way (:func:`averages_by_dividing_first`). Returns the ``average`` the
    collective goes on with: False once divided here (the sum is then the mean)."""
    if average and parts > 1 and averages_by_dividing_first(data.dtype):
        data /= data.dtype.type(parts)
        return False
    return average


def check_reduce_fill(fill: FillPolicy, op: str) -> None:
    """Refuse ``fill`` for a phase that adds what it receives (a reduce-scatter, a
    server's aggregation): those messages land in scratch space, so there is no
    previous value to keep, and the buffer's leftovers would be added to the sum."""
    if fill is FillPolicy.PREVIOUS:
        raise UsageError(
            f"{op}: fill='previous' cannot fill the reduce phase (what it receives lands "
            "in scratch space and is added): use 'zero' or 'rescale'; with a gather or "
            "pull bound above 0, that phase keeps previous values by itself"
        )


def slice_segments(segments: Segments | None, start: int, stop: int) -> list[tuple[int, int, int]]:
    """The layer segments covering elements ``[start, stop)``, re-based to ``start``."""
    if segments is None:
        return []
    out = []
    for off, length, layer in segments:
        a, b = max(off, start), min(off + length, stop)
        if a < b:
            out.append((a - start, b - a, layer))
    return out


def cancel_all(futures: Sequence[Future[Any]]) -> None:
    """Cancel the transfers of a call that failed: a receive posted into the
    caller's memory must not write there after the call has raised (the
    endpoint forgets a cancelled transfer and tells its peer)."""
    for fut in futures:
        fut.cancel()


class _CallNumbers:
    """The next call number of one endpoint and channel, and the communicator
    that draws them now (one at a time: two live communicators on one channel
    would take numbers in whatever order their threads come, which differs
    from rank to rank)."""

    __slots__ = ("_lock", "_next", "holder")

    def __init__(self) -> None:
        self._next = 0
        self._lock = threading.Lock()
        self.holder: weakref.ref[Communicator] | None = None

    def take(self) -> int:
        with self._lock:
            call = self._next
            self._next = (call + 1) & 0xFFFFFFFF
            return call

    def peek(self) -> int:
        with self._lock:
            return self._next

    def skip_to(self, call: int) -> None:
        with self._lock:
            self._next = call & 0xFFFFFFFF


_CALL_NUMBERS: weakref.WeakKeyDictionary[Endpoint, dict[int, _CallNumbers]] = (
    weakref.WeakKeyDictionary()
)
_CALL_NUMBERS_LOCK = threading.Lock()


def _claim_call_numbers(comm: Communicator) -> _CallNumbers:
    with _CALL_NUMBERS_LOCK:
        channels = _CALL_NUMBERS.setdefault(comm.endpoint, {})
        numbers = channels.setdefault(comm.channel, _CallNumbers())
        if numbers.holder is not None and numbers.holder() is not None:
            raise ConfigError(
                f"rank {comm.rank}: channel {comm.channel} of this endpoint belongs to a "
                "live Communicator (of a DLCPState, say): close() that one first, or give "
                "this one another channel"
            )
        numbers.holder = weakref.ref(comm)
        return numbers


def _release_call_numbers(comm: Communicator) -> None:
    with _CALL_NUMBERS_LOCK:
        numbers = comm._calls
        if numbers.holder is not None and numbers.holder() is comm:
            numbers.holder = None


class Communicator:
    """Ranks ``0..world_size-1`` over one :class:`Endpoint`."""

    #: seconds :meth:`wait` allows beyond the timeout before it gives up on a
    #: future nobody settled (the endpoint fails one that times out before that)
    BACKSTOP_MARGIN = 5.0

    def __init__(
        self, endpoint: Endpoint, world_size: int, *, channel: int = 0, timeout: float | None = None
    ) -> None:
        if not 1 <= world_size <= MAX_WORLD:
            raise ConfigError(
                f"world_size={world_size} outside 1..{MAX_WORLD} (the collectives' "
                "message roles number the steps of a call)"
            )
        if not 0 <= endpoint.rank < world_size:
            raise ConfigError(f"the endpoint's rank {endpoint.rank} is not in 0..{world_size - 1}")
        if not 0 <= channel <= MAX_CHANNEL:
            raise ConfigError(f"channel={channel} outside 0..{MAX_CHANNEL}")
        if timeout is not None and not 0 < timeout < float("inf"):
            raise ConfigError(f"timeout={timeout} must be a finite number of seconds > 0")
        self.endpoint = endpoint
        self.rank = endpoint.rank
        self.world_size = world_size
        self.channel = channel
        self.timeout = timeout if timeout is not None else endpoint.config.timeout
        self._calls = _claim_call_numbers(self)
        self._closed = False
        #: scratch buffers between calls (:meth:`take_scratch`)
        self._scratch: list[npt.NDArray[np.uint8]] = []
        self._scratch_lock = threading.Lock()

    def close(self) -> None:
        """Give the channel back: a later communicator on this endpoint and channel
        continues the call numbers (one that is garbage-collected gives it back too).
        This one takes no more."""
        self._closed = True
        _release_call_numbers(self)

    def next_call(self) -> int:
        if self._closed:  # (its numbers may belong to a later communicator now)
            raise UsageStateError(
                f"rank {self.rank}: channel {self.channel}'s communicator is closed"
            )
        return self._calls.take()

    def peek_call(self) -> int:
        """The call number the next collective call takes (without taking it)."""
        return self._calls.peek()

    @contextlib.contextmanager
    def reserve(self, n: int) -> Iterator[None]:
        """The code inside takes the next ``n`` call numbers. If it fails on this
        rank before taking them all (staging a tensor, a CUDA event), the rest are
        skipped: the other ranks took them, and this rank's later calls must meet
        their later calls, not data meant for these (a later call of the same
        size then completed with the wrong peers' values, and said nothing)."""
        first = self._calls.peek()

        def settle() -> None:
            taken = (self._calls.peek() - first) & 0xFFFFFFFF
            if taken < n:
                self._calls.skip_to(first + n)
            elif taken > n:  # (a caller that counts wrong desynchronises every rank)
                raise UsageStateError(f"rank {self.rank}: {taken} call numbers taken, {n} reserved")

        try:
            yield
        except BaseException as exc:
            try:
                settle()
            except RuntimeError as miscount:  # the body's error stays the one raised
                exc.add_note(str(miscount))
            raise
        settle()

    def take_scratch(self, nbytes: int) -> npt.NDArray[np.uint8]:
        """At least ``nbytes`` of memory for one call's own use, the last call's
        if it was big enough: training repeats its bucket sizes, so after the
        first step a call touches no new pages (a fresh array of a bucket's size
        per call cost page faults that zeroed it). Calls in several threads each
        get their own."""
        with self._scratch_lock:
            buf = self._scratch.pop() if self._scratch else None
        if buf is None or len(buf) < nbytes:
            buf = np.empty(nbytes, np.uint8)
        return buf

    def give_back_scratch(self, buf: npt.NDArray[np.uint8]) -> None:
        """``buf`` (from :meth:`take_scratch`) for a later call; the communicator
        keeps the largest two, the largest last."""
        with self._scratch_lock:
            self._scratch.append(buf)
            self._scratch.sort(key=len)
            del self._scratch[:-2]

    def msg_id(self, role: int) -> int:
        if not 0 <= role <= MAX_ROLE:
            raise UsageError(f"message role {role} outside 0..{MAX_ROLE}")
        return (self.channel << 12) | role

    def send(
        self,
        array: npt.NDArray[Any],
        *,
        to: int,
        call: int,
        role: int,
        segments: Segments | None,
        p: float,
        borrow: bool = False,
    ) -> Future[SendReport]:
        """``borrow``: see :meth:`Endpoint.send`."""
        return self.endpoint.send(
            array, to=to, step=call, msg=self.msg_id(role), layers=segments or None, p=p,
            borrow=borrow,
        )  # fmt: skip

    def send_part(
        self,
        data: npt.NDArray[Any],
        a: int,
        b: int,
        *,
        to: int,
        call: int,
        role: int,
        segments: Segments | None,
        p: float,
        borrow: bool = False,
    ) -> Future[SendReport]:
        """Send ``data[a:b]`` with the layer segments that cover it."""
        return self.send(
            data[a:b], to=to, call=call, role=role, segments=slice_segments(segments, a, b), p=p,
            borrow=borrow,
        )  # fmt: skip

    def recv(
        self,
        out: npt.NDArray[Any],
        *,
        src: int,
        call: int,
        role: int,
        p: float,
        fill: FillPolicy,
        accumulate: bool = False,
    ) -> Future[Received]:
        return self.endpoint.recv(
            src=src, step=call, msg=self.msg_id(role), out=out, p=p, fill=fill,
            accumulate=accumulate,
        )  # fmt: skip

    def wait(self, fut: Future[Any]) -> Any:
        """The result of a send or receive. The endpoint fails one that exceeds its
        own timeout, naming the peer and message; this wait's longer limit only
        guards against a future nobody settles."""
        limit = self.timeout + self.BACKSTOP_MARGIN
        try:
            return fut.result(timeout=limit)
        except FutureTimeout:
            if fut.done():  # the endpoint's own PeerTimeout (a TimeoutError too): keep it
                raise
            fut.cancel()
            what = getattr(fut, "what", "") or f"rank {self.rank}: a message of a collective call"
            raise PeerTimeout(
                f"{what} did not complete within {limit:g} s "
                f"(Communicator timeout {self.timeout:g} s + {self.BACKSTOP_MARGIN:g})"
            ) from None
