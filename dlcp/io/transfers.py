"""An endpoint's transfers in flight and what settles them.

:class:`Transfers` holds the sends and receives an :class:`~dlcp.io.endpoint.Endpoint`
is waiting on, by (peer, step, msg), with their futures and deadlines, and the
received (or failed) messages nobody has asked for yet. It settles the futures
from the session's events, from deadlines that pass, and from a peer's failure.
The endpoint calls it under its lock; nothing here touches a socket.

Events can be matched to their transfers at once and settled later
(``dispatch(defer=True)``, then :meth:`Transfers.settle`): the endpoint matches
them before it sends, so that a peer found gone while sending does not fail a
transfer whose event had come, and settles them after it sent, so that what the
session queued with an event (a completed receive's STOP) is on the wire before
the future's callbacks run (one that ends the process would otherwise leave the
sender without its STOP).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import PeerTimeout, TransferFailed, UsageError
from ..proto.config import FillPolicy
from ..proto.late_claim import ClaimRefused, claim_completed
from ..proto.session import MessageDelivered, MessageFailed, MessageReceived, Session
from .records import Pending, Received

__all__ = ["Key", "Transfers"]

log = logging.getLogger("dlcp.io")

Key = tuple[int, int, int]  # (peer, step, msg)

#: failures of messages nobody asked for, kept for a receive posted later (the
#: oldest go first). Received messages are not counted: the session bounds the
#: bytes they hold (max_unexpected_bytes) and refuses what would not fit, so none
#: is ever dropped here after its sender heard it was delivered.
_MAX_UNCLAIMED_FAILURES = 1024


class Transfers:
    """Pending sends and receives of one endpoint (see the module docstring)."""

    def __init__(
        self,
        session: Session,
        *,
        rank: int,
        timeout: float,
        emulated_loss: float,
        stop_sending: Callable[[int, int, int], object] | None = None,
    ):
        self._session = session
        #: stops a send's round in the native engine at once (dst, step, msg), so that
        #: a send failed or cancelled here is no longer read from the caller's array
        #: when its future settles (a lent array is the caller's again then)
        self._stop_sending = stop_sending
        self._rank = rank
        self._timeout = timeout
        self._emulated_loss = emulated_loss
        #: tables in insertion order: the oldest entry has the earliest deadline
        #: (every transfer gets the same timeout). Entries go in with :meth:`pend`.
        self.sends: dict[Key, Pending] = {}
        self.recvs: dict[Key, Pending] = {}
        #: no pending transfer's deadline is earlier (math.inf: none pending): the
        #: earliest deadline when last looked for, lowered by what is pended since.
        #: Entries taken out only make the true one later: :meth:`expire`, which
        #: the I/O thread calls once this has passed, looks for it again. (A
        #: plain float: the I/O thread reads it every turn.)
        self.earliest = math.inf
        self.unclaimed: dict[Key, MessageReceived | MessageFailed] = {}
        #: the keys of the failures among them, oldest first
        self._unclaimed_failures: OrderedDict[Key, None] = OrderedDict()
        #: transfers matched to their events (and out of the tables) whose futures
        #: are not settled yet: (future, what settles it), in event order
        self.settlements: deque[tuple[Future[Any], Callable[[], object]]] = deque()

    def pend(self, key: Key, pending: Pending, *, outgoing: bool) -> None:
        """Wait for transfer ``key`` (a send if ``outgoing``, else a receive)."""
        (self.sends if outgoing else self.recvs)[key] = pending
        if pending.deadline < self.earliest:
            self.earliest = pending.deadline

    def _drop(self, key: Key, *, outgoing: bool) -> None:
        """Have the session stop transfer ``key`` (and tell the peer); a send's
        round stops in the engine before this returns."""
        self._session.cancel(key[0], step=key[1], msg=key[2], outgoing=outgoing)
        if outgoing and self._stop_sending is not None:
            self._stop_sending(*key)

    def waits_on(self, peer: int) -> bool:
        """Whether anything pending is with ``peer``."""
        return any(k[0] == peer for k in itertools.chain(self.sends, self.recvs))

    def dispatch(self, *, defer: bool = False) -> None:
        """Match the session's events to their transfers (taken out of the tables)
        and park what nobody waits for; then settle their futures (:meth:`settle`),
        unless ``defer``: then the next ``settle()``, or ``dispatch()`` without
        ``defer``, settles them (before what that dispatch matches)."""
        while (ev := self._session.next_event()) is not None:
            # (exact classes of dlcp.proto.events, none subclassed: no isinstance calls)
            if type(ev) is MessageDelivered:
                pending = self.sends.pop((ev.dst, ev.step, ev.msg), None)
                if pending is not None:
                    fut = pending.future
                    self.queue_settlement(fut, fut.set_result, ev.report)
            elif type(ev) is MessageReceived:
                key = (ev.src, ev.step, ev.msg)
                rpending = self.recvs.pop(key, None)
                if rpending is not None:
                    fut = rpending.future
                    self.queue_settlement(fut, self.complete_recv, fut, ev, rpending.out)
                else:
                    self._park(key, ev)
            elif type(ev) is MessageFailed:
                key = (ev.peer, ev.step, ev.msg)
                table = self.sends if ev.outgoing else self.recvs
                failed = table.pop(key, None)
                error_cls = PeerTimeout if ev.peer_timeout else TransferFailed
                reason = f"rank {self._rank}: {ev.reason} (step {ev.step}, msg {ev.msg})"
                if failed is not None:
                    fut = failed.future
                    self.queue_settlement(fut, fut.set_exception, error_cls(reason))
                elif not ev.outgoing:
                    self._park(key, ev)
        if not defer:
            self.settle()

    def queue_settlement(
        self, future: Future[Any], settle: Callable[..., object], *args: Any, **kwargs: Any
    ) -> None:
        """Have :meth:`settle` call ``settle(*args, **kwargs)``, which settles ``future``."""
        self.settlements.append((future, functools.partial(settle, *args, **kwargs)))

    def settle(self) -> None:
        """Settle the futures that :meth:`dispatch` matched, in event order. A
        future's callback may come back here (through the endpoint): each
        settlement is taken off the queue before it runs."""
        while self.settlements:
            future, settlement = self.settlements.popleft()
            try:
                settlement()
            except Exception as exc:  # (complete_recv's copy into out, say)
                if not future.done():  # its caller learns why, instead of waiting
                    future.set_exception(exc)
                raise

    def _park(self, key: Key, ev: MessageReceived | MessageFailed) -> None:
        self.unclaimed[key] = ev
        if isinstance(ev, MessageFailed):
            self._unclaimed_failures[key] = None
            while len(self._unclaimed_failures) > _MAX_UNCLAIMED_FAILURES:
                old, _ = self._unclaimed_failures.popitem(last=False)
                self.unclaimed.pop(old, None)

    def take_unclaimed(self, key: Key) -> MessageReceived | MessageFailed | None:
        """The parked message ``key`` for a receive posted now (None: none); the
        session stops counting the bytes it held."""
        ev = self.unclaimed.pop(key, None)
        if ev is not None:
            self._unclaimed_failures.pop(key, None)
            self._session.release(key[0], step=key[1], msg=key[2])
        return ev

    def claim(
        self,
        fut: Future[Received],
        ev: MessageReceived | MessageFailed,
        out: npt.NDArray[Any] | None,
        *,
        p: float | None,
        fill: FillPolicy,
        accumulate: bool = False,
    ) -> None:
        """Settle receive ``fut`` with a message that completed before it was
        posted: by the sender's bound, lost elements filled as the session's
        default fill says. Held to the receive's own ``p`` (a message that lost
        more fails) and ``fill`` (applied now where it can be, else it fails):
        a late receive must not get silently looser data than it asked for.
        With ``accumulate`` the message is added to ``out`` (float32, zero fill)."""
        if isinstance(ev, MessageReceived):
            # (the core decides, by dlcp.proto.late_claim's rules; this applies it)
            claim = claim_completed(ev, None if accumulate else out, p=p, fill=fill)
            if isinstance(claim, ClaimRefused):
                fut.set_exception(TransferFailed(f"rank {self._rank}: {claim.why}"))
                return
            ev = claim.event
            if accumulate and out is not None:
                if self._misfit(fut, ev, out):
                    return
                np.add(out, ev.data, out=out)
                fut.set_result(
                    Received(ev.src, ev.step, ev.msg, out, ev.report, self._emulated_loss)
                )
                self._session.keep_spare(ev.data)
                return
            if claim.in_out:  # out holds the message now
                assert out is not None
                fut.set_result(
                    Received(ev.src, ev.step, ev.msg, out, ev.report, self._emulated_loss)
                )
                self._session.keep_spare(ev.data)
                return
        if self.complete_recv(fut, ev, out):  # (the message's own buffer is free)
            assert isinstance(ev, MessageReceived)
            self._session.keep_spare(ev.data)

    def complete_recv(
        self,
        fut: Future[Received],
        ev: MessageReceived | MessageFailed,
        out: npt.NDArray[Any] | None,
    ) -> bool:
        """Settle receive ``fut`` with message ``ev``, copied into ``out`` if given;
        whether it was copied (``ev``'s data is then no longer needed)."""
        if isinstance(ev, MessageFailed):
            error_cls = PeerTimeout if ev.peer_timeout else TransferFailed
            fut.set_exception(
                error_cls(f"rank {self._rank}: {ev.reason} (step {ev.step}, msg {ev.msg})")
            )
            return False
        data = ev.data
        if out is not None and out is not data:
            if self._misfit(fut, ev, out):
                return False
            out[...] = data
            fut.set_result(Received(ev.src, ev.step, ev.msg, out, ev.report, self._emulated_loss))
            return True
        fut.set_result(Received(ev.src, ev.step, ev.msg, data, ev.report, self._emulated_loss))
        return False

    @staticmethod
    def _misfit(fut: Future[Received], ev: MessageReceived, out: npt.NDArray[Any]) -> bool:
        """Whether ``out`` cannot hold message ``ev`` (``fut`` then fails, saying why)."""
        data = ev.data
        if out.shape == data.shape and out.dtype == data.dtype:
            return False
        fut.set_exception(
            UsageError(
                f"out is {out.dtype}{list(out.shape)} but message (step {ev.step}, "
                f"msg {ev.msg}) from rank {ev.src} is {data.dtype}{list(data.shape)}"
            )
        )
        return True

    def forget(self, key: Key, outgoing: bool, fut: Future[Any]) -> bool:
        """The caller cancelled ``fut``: drop its transfer and have the session stop
        it (and tell the peer). False if it had ended already."""
        table = self.sends if outgoing else self.recvs
        pending = table.get(key)
        if pending is None or pending.future is not fut:
            return False
        del table[key]
        self._drop(key, outgoing=outgoing)
        return True

    def expire(self, now: float) -> None:
        """Fail what ran past its deadline; :attr:`earliest` is the earliest
        deadline of what is left."""
        self.earliest = math.inf
        for table, outgoing in ((self.sends, True), (self.recvs, False)):
            while table:
                key, pending = next(iter(table.items()))
                if now < pending.deadline:  # the oldest entry: the rest expire later
                    self.earliest = min(self.earliest, pending.deadline)
                    break
                del table[key]
                try:  # (words for the error: never a reason to end the I/O thread)
                    seen = self._session.progress(
                        key[0], step=key[1], msg=key[2], outgoing=outgoing, now=now
                    )
                except Exception:
                    log.exception("rank %d: describing message %s failed", self._rank, key)
                    seen = ""
                self._drop(key, outgoing=outgoing)
                what = "to" if outgoing else "from"
                pending.future.set_exception(
                    PeerTimeout(
                        f"rank {self._rank}: message (step {key[1]}, msg {key[2]}) {what} rank "
                        f"{key[0]} did not complete within {self._timeout:g} s"
                        + (f": {seen}" if seen else "")
                    )
                )

    def fail_peer(self, peer: int, why: str, *, receives: bool = True) -> None:
        """Fail what is pending with ``peer``: its sends, and its receives unless
        ``receives`` is False (the failure was on our way to it only)."""
        tables = ((self.sends, True), (self.recvs, False)) if receives else ((self.sends, True),)
        for table, outgoing in tables:
            for key in [k for k in table if k[0] == peer]:
                # (a future's callbacks run in this loop, and may cancel a sibling)
                pending = table.pop(key, None)
                if pending is None:
                    continue
                self._drop(key, outgoing=outgoing)
                pending.future.set_exception(
                    TransferFailed(
                        f"rank {self._rank}: message (step {key[1]}, msg {key[2]}) "
                        f"{'to' if outgoing else 'from'} rank {peer}: {why}"
                    )
                )

    def fail_all(self, error: Exception) -> None:
        """Fail everything pending with ``error`` (the endpoint is going away).
        Transfers already matched to their events settle first, as those say (a
        receive whose message came gets it)."""
        while self.settlements:
            with contextlib.suppress(Exception):  # (settle() gave its future the error)
                self.settle()
        for table in (self.sends, self.recvs):
            # emptied first: a future's callbacks may cancel (and so forget) another
            pendings = list(table.values())
            table.clear()
            for pending in pendings:
                if not pending.future.done():
                    pending.future.set_exception(error)
