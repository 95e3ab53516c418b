"""Point-to-point operations of the dlcp process group: ``send``, ``recv``,
``isend``, ``irecv``, a receive from any source, and so ``batch_isend_irecv``.

Torch's rules: messages between two ranks with the same tag are received in the
order they were sent (non-overtaking); messages with different tags are matched
independently; a receive posted earlier is matched before one posted later; a
receive from any source takes the first message of that tag that has arrived
from any peer, and reports its source.

How that maps onto DLCP messages. Each message is exact (``p = 0``) and goes on
its own: its key is the group's point-to-point channel, the tag and a sequence
number per (peer, tag) that both sides count (the sender per destination, the
receiver per source), so a message never meets another one. Tags are 0 .. 2^24-1
(12 bits in the message id, 12 in the step, with 20 bits of sequence number).
Point-to-point operations do not take the collectives' call numbers: they start
in the caller's thread at once, outside the order in which collectives run, so
an ``irecv`` posted before a collective never holds that collective up.

A send is eager: the receiving endpoint keeps a message nobody has asked for yet
(up to its ``max_unexpected_bytes``), so a send completes once the message is
there, whether or not the receive was posted; ``isend`` never waits for the
receiver's code.

A receive *arrival* is a DLCP receive posted for one (peer, tag, sequence
number). A receive from one source takes the next arrival of its (peer, tag),
posted into its own tensor when it is the first to want it. A receive from any
source posts an arrival on every other peer (into buffers of their own) and
takes the first one that completes; the others stay posted for the next
receives of that tag from those peers. An arrival that ran past the timeout
with nobody taking it is dropped: the peer's message of that number, if it ever
comes, fails on the sender (the receiver cancelled it), and both sides go on
with the next number; a receive waiting on it fails with a timeout error.

Results and errors reach the caller through a :class:`~.pg_tensors.DLCPWork`,
completed by the group's point-to-point threads (see :mod:`.pg_serve`), never
by the endpoint's I/O thread. Tensors up to 1 GiB.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dlcp.errors import PeerTimeout
from dlcp.io.endpoint import Endpoint, Received

from .pg_serve import OrderedServers
from .pg_tensors import MAX_PART_BYTES, DLCPWork, HostTensor, check_tensors
from .pg_timeouts import timed_out

__all__ = ["MAX_TAG", "P2P_CHANNEL", "PointToPoint", "message_key"]

log = logging.getLogger("dlcp.shims")

#: the message-id channel of point-to-point messages (collectives use another)
P2P_CHANNEL = 3
SEQ_BITS = 20
MAX_TAG = (1 << 24) - 1
#: the message of an empty tensor (a DLCP message has at least one element); its
#: dtype (float16) tells it from a tensor's bytes (uint8)
_EMPTY = np.zeros(1, dtype=np.float16)
#: the item that has the point-to-point threads look at the receives
_POKE = object()


def message_key(tag: int, seq: int) -> tuple[int, int]:
    """(step, msg) of the ``seq``-th message with ``tag`` between two ranks."""
    step = ((tag >> 12) << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1))
    return step, (P2P_CHANNEL << 12) | (tag & 0xFFF)


@dataclass(eq=False, slots=True)
class _Receiver:
    op: str
    srcs: tuple[int, ...]
    tag: int
    host: HostTensor
    future: torch.futures.Future[Any]
    work: DLCPWork
    posted: float
    any_source: bool
    arrival: _Arrival | None = None


@dataclass(eq=False, slots=True)
class _Arrival:
    src: int
    seq: int
    future: Future[Received]
    posted: float
    #: whether it was posted into its receiver's tensor (else into its own buffer)
    direct: bool = False


@dataclass(slots=True)
class _Finished:
    """What the point-to-point threads complete once the turn has passed on."""

    settle: list[Callable[[], None]] = field(default_factory=list)

    def __call__(self) -> None:
        for fn in self.settle:  # (one failing must not keep the others' callers waiting)
            try:
                fn()
            except Exception:  # pragma: no cover - a callback's own error
                log.exception("dlcp point-to-point: completing an operation failed")


class PointToPoint:
    """The point-to-point side of one process group (see the module docstring)."""

    def __init__(self, endpoint: Endpoint, rank: int, size: int, *, name: str) -> None:
        self.endpoint, self.rank, self.size = endpoint, rank, size
        self.timeout = endpoint.config.timeout
        self._lock = threading.Lock()
        self._send_seq: defaultdict[tuple[int, int], int] = defaultdict(int)
        self._post_seq: defaultdict[tuple[int, int], int] = defaultdict(int)
        #: arrivals nobody has taken yet, per (peer, tag), in sequence order
        self._arrivals: defaultdict[tuple[int, int], deque[_Arrival]] = defaultdict(deque)
        #: receives not yet bound to an arrival, in the order they were posted
        self._waiting: list[_Receiver] = []
        #: receives bound to an arrival that has not completed
        self._bound: list[_Receiver] = []
        self._servers: OrderedServers[Any] = OrderedServers(
            self._serve, name=f"dlcp-p2p-{name or 'default'}-{rank}", os_name=f"dlcp-p2p-{rank}"
        )

    # ------------------------------------------------------------------ caller side

    def check(self, op: str, tensors: list[torch.Tensor], peer: int | None, tag: int) -> None:
        check_tensors(tensors, op)
        if len(tensors) != 1:
            raise ValueError(f"{op} takes one tensor, got {len(tensors)}")
        nbytes = tensors[0].numel() * tensors[0].element_size()
        if nbytes > MAX_PART_BYTES:
            raise ValueError(
                f"{op}: a tensor of {nbytes} bytes exceeds dlcp's point-to-point limit of "
                f"{MAX_PART_BYTES} bytes (split it)"
            )
        if not isinstance(tag, int) or not 0 <= tag <= MAX_TAG:
            raise ValueError(f"{op}: tag={tag!r} outside 0..{MAX_TAG}")
        if peer is not None:
            if not isinstance(peer, int) or not 0 <= peer < self.size:
                raise ValueError(f"{op}: peer rank {peer!r} outside 0..{self.size - 1}")
            if peer == self.rank:
                raise ValueError(f"{op}: rank {self.rank} names itself as the peer")

    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> DLCPWork:
        host = HostTensor(tensor)  # (a copy of a CUDA or strided tensor, made now)
        payload = host.bytes() if tensor.numel() else _EMPTY
        future: torch.futures.Future[Any] = torch.futures.Future()
        op = f"send to rank {dst} (tag {tag})"
        work = DLCPWork(op, future)
        with self._lock:  # (a send refused here leaves the number to the next one)
            seq = self._send_seq[dst, tag]
            step, msg = message_key(tag, seq)
            sent = self.endpoint.send(payload, to=dst, step=step, msg=msg, p=0.0)
            self._send_seq[dst, tag] = seq + 1
        sent.add_done_callback(
            lambda f: self._servers.put(functools.partial(self._sent, f, op, dst, future, tensor))
        )
        return work

    def recv(self, tensor: torch.Tensor, src: int | None, tag: int) -> DLCPWork:
        srcs = (src,) if src is not None else tuple(q for q in range(self.size) if q != self.rank)
        peer = f"rank {src}" if src is not None else "any source"
        op = f"recv from {peer} (tag {tag})"
        future: torch.futures.Future[Any] = torch.futures.Future()
        work = DLCPWork(op, future)
        receiver = _Receiver(
            op, srcs, tag, HostTensor(tensor), future, work, time.monotonic(), src is None
        )
        with self._lock:
            self._waiting.append(receiver)
            try:
                self._match()  # binds it, or posts what it waits for
            except BaseException:  # (posting failed in the caller: a peer without address)
                if receiver in self._waiting:
                    self._waiting.remove(receiver)
                raise
        self._servers.put(_POKE)  # (what is bound and done already completes there)
        return work

    def close(self) -> None:
        """Stop the threads once what is queued is done (call after the endpoint
        closed: its failures of pending transfers are queued by then)."""
        self._servers.stop()

    def join(self, timeout: float) -> bool:
        return self._servers.join(timeout)

    # ------------------------------------------------------------------ matching

    def _post(self, src: int, tag: int, out: HostTensor | None) -> _Arrival:
        """Post the next arrival of (src, tag), into ``out`` if given (under the lock)."""
        seq = self._post_seq[src, tag]
        step, msg = message_key(tag, seq)
        into = out.bytes() if out is not None and out.flat.numel() else None
        fut = self.endpoint.recv(src=src, step=step, msg=msg, out=into, p=0.0)
        self._post_seq[src, tag] = seq + 1  # (not taken when the endpoint refused it)
        fut.add_done_callback(lambda _: self._servers.put(_POKE))
        return _Arrival(src, seq, fut, time.monotonic(), direct=into is not None)

    def _head(self, src: int, tag: int, *, post: bool) -> _Arrival | None:
        """The first arrival of (src, tag) nobody took, dropping the ones that
        timed out unclaimed (their keys are spent on both sides); posted if
        ``post`` and there is none (under the lock)."""
        queue = self._arrivals[src, tag]
        while queue and queue[0].future.done() and _timed_out(queue[0].future):
            queue.popleft()
        if not queue and post:
            queue.append(self._post(src, tag, None))
        return queue[0] if queue else None

    def _match(self) -> None:
        """Bind waiting receives to arrivals, earliest posted first (under the lock).
        A receive from one source takes the next arrival of its (peer, tag) unless
        an earlier receive from any source with that tag still waits (which might
        take it); a receive from any source takes a completed arrival only."""
        blocked: set[int] = set()  # tags with an unbound receive from any source
        still: list[_Receiver] = []
        for r in self._waiting:
            if r.any_source:
                got = None
                for q in r.srcs:
                    head = self._head(q, r.tag, post=True)
                    if got is None and head is not None and head.future.done():
                        got = head
                if got is not None:
                    self._arrivals[got.src, r.tag].popleft()
                    r.arrival = got
                    self._bound.append(r)
                    continue
                blocked.add(r.tag)
                still.append(r)
            elif r.tag in blocked:
                still.append(r)
            else:
                (q,) = r.srcs
                head = self._head(q, r.tag, post=False)
                if head is not None:
                    self._arrivals[q, r.tag].popleft()
                    r.arrival = head
                else:
                    r.arrival = self._post(q, r.tag, r.host)
                self._bound.append(r)  # (its arrival completes it: see _serve)
        self._waiting = still

    # ------------------------------------------------------------------ threads

    def _serve(self, item: Any) -> Callable[[], None]:
        """Run in turn: a send's completion, or a look at the receives (_POKE).
        Never raises: an error here would end the thread that completes every
        point-to-point operation of the group (they would then hang)."""
        try:
            if item is not _POKE:
                result: Callable[[], None] = item()
                return result
            return self._look()
        except Exception:  # pragma: no cover - a bug; logged, the thread goes on
            log.exception("dlcp point-to-point (rank %d): completing failed", self.rank)
            return _Finished()

    def _look(self) -> _Finished:
        """Fail receives from any source that ran past the timeout, bind waiting
        receives, and complete the bound ones whose arrival is done."""
        finished = _Finished()
        now = time.monotonic()
        with self._lock:
            expired = [r for r in self._waiting if r.any_source and now >= r.posted + self.timeout]
            for r in expired:
                self._waiting.remove(r)
            try:
                self._match()
            except Exception as exc:  # (the endpoint closed under a receive, say)
                failed, self._waiting = self._waiting, []
                for r in failed:
                    finished.settle.append(functools.partial(r.future.set_exception, exc))
            ready = [r for r in self._bound if r.arrival is not None and r.arrival.future.done()]
            for r in ready:
                self._bound.remove(r)
        for r in expired:
            error = timed_out(r.op, self.rank, r.srcs, self.timeout, "no peer sent a message")
            finished.settle.append(functools.partial(r.future.set_exception, error))
        for r in ready:
            finished.settle.append(self._received(r))
        return finished

    def _received(self, r: _Receiver) -> Callable[[], None]:
        arrival = r.arrival
        assert arrival is not None
        try:
            got = arrival.future.result()
            if not arrival.direct:
                _copy(r, got)
            r.host.write_back()
        except PeerTimeout as exc:
            error: Exception = timed_out(r.op, self.rank, [arrival.src], self.timeout, str(exc))
            return functools.partial(r.future.set_exception, error)
        except Exception as exc:
            exc.add_note(f"in dlcp process group operation {r.op} on rank {self.rank}")
            return functools.partial(r.future.set_exception, exc)
        r.work.received_from = arrival.src
        return functools.partial(r.future.set_result, [r.host.tensor])

    def _sent(
        self,
        sent: Future[Any],
        op: str,
        dst: int,
        future: torch.futures.Future[Any],
        tensor: torch.Tensor,
    ) -> Callable[[], None]:
        try:
            sent.result()
        except PeerTimeout as exc:
            error: Exception = timed_out(op, self.rank, [dst], self.timeout, str(exc))
            return functools.partial(future.set_exception, error)
        except Exception as exc:
            exc.add_note(f"in dlcp process group operation {op} on rank {self.rank}")
            return functools.partial(future.set_exception, exc)
        return functools.partial(future.set_result, [tensor])


def _timed_out(fut: Future[Any]) -> bool:
    return fut.exception() is not None and isinstance(fut.exception(), PeerTimeout)


def _copy(r: _Receiver, got: Received) -> None:
    """A message received into its own buffer, into the receiver's tensor."""
    t = r.host.tensor
    want = r.host.flat.numel() * r.host.flat.element_size()
    data = got.data
    if want == 0:
        ok = data.dtype == np.float16 and data.size == 1
    else:
        ok = data.dtype == np.uint8 and data.size == want
    if not ok:
        sent = 0 if data.dtype == np.float16 else data.size
        raise ValueError(
            f"{r.op}: rank {got.src} sent {sent} bytes, the tensor ({t.dtype}"
            f"{list(t.shape)}) takes {want}"
        )
    r.host.bytes()[:] = data
