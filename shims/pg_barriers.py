"""The process group's barriers: ``barrier`` and ``monitored_barrier``.

A mixin of :class:`~shims.process_group.DLCPProcessGroup`.

``barrier`` is a collective, queued behind every operation issued before it:
each rank sends a one-byte token to every other rank and waits for theirs
(exact messages), with its signature (:mod:`.pg_signature`: a barrier on one
rank beside another collective on another is refused on both). A rank that
never comes is named: the error says "Timed out", the operation, every rank
whose token did not arrive, and the timeout.

``monitored_barrier(timeout, wait_all_ranks=False)`` is Gloo's diagnosis: rank 0
waits up to ``timeout`` for a token from every other rank, then answers each;
the others wait up to ``timeout`` for that answer. Rank 0 raises naming the
first rank that did not arrive (every such rank with ``wait_all_ranks``), in
the words Gloo uses ("Rank 2 failed to pass monitoredBarrier in 2000 ms"), and
then does not answer, so the others fail too. A timeout of 0 fails rank 0 at
once ("Rank 0 timed out in monitoredBarrier after 0 ms", as Gloo, which checks
the time left before waiting for each rank). It runs at once in the caller's
thread, outside the collectives' order, on its own message channel. (torch's
``dist.monitored_barrier`` refuses every backend but Gloo by name; code that
calls the group's method reaches this one.)
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import numpy as np

from dlcp.collectives import CollectiveReport
from dlcp.collectives.comm import ReportBuilder, cancel_all
from dlcp.errors import PeerTimeout, UsageError
from dlcp.proto.config import FillPolicy

from .pg_mixin import GroupMixin
from .pg_signature import Op, signed
from .pg_tensors import DLCPWork
from .pg_timeouts import DLCPTimeout, timed_out

__all__ = ["MONITORED_CHANNEL", "Barriers"]

#: message-id channel of monitored barriers (collectives and point-to-point use others)
MONITORED_CHANNEL = 4
_TOKEN = np.zeros(1, dtype=np.uint8)
_BARRIER = Op("barrier")


class Barriers(GroupMixin):
    """Mixed into DLCPProcessGroup, before torch's ProcessGroup (see the module)."""

    _monitored = 0
    _monitored_lock = threading.Lock()

    def barrier(self, opts: Any = None) -> DLCPWork:
        def run() -> CollectiveReport | None:
            call = self.comm.next_call()
            report = ReportBuilder("barrier", call, 1)
            peers = [q for q in range(self._size) if q != self._rank]
            with signed(self.comm, call, _BARRIER, {q: ((), ()) for q in peers}):
                self._barrier_tokens(call, peers, report)
            return report.build()

        return self._submit("barrier", run, [], [])

    def _barrier_tokens(self, call: int, peers: list[int], report: ReportBuilder) -> None:
        incoming = {
            q: self.comm.recv(
                np.zeros(1, np.uint8), src=q, call=call, role=0, p=0.0, fill=FillPolicy.ZERO
            )
            for q in peers
        }
        outgoing = [
            self.comm.send(_TOKEN, to=q, call=call, role=0, segments=None, p=0.0) for q in peers
        ]
        missing, error = _wait_all(incoming, self.comm.timeout + self.comm.BACKSTOP_MARGIN)
        if error is not None:
            cancel_all([*incoming.values(), *outgoing])
            if missing:
                raise timed_out("barrier", self._rank, missing, self.comm.timeout, str(error))
            raise error
        for fut in incoming.values():
            report.received(fut.result(), bounded=False)
        for out in outgoing:
            report.sent(self.comm.wait(out), 1)

    def monitored_barrier(
        self, timeout: timedelta | None = None, wait_all_ranks: bool = False
    ) -> None:
        seconds = timeout.total_seconds() if timeout is not None else self.comm.timeout
        if not seconds >= 0:  # (NaN too)
            raise UsageError(f"monitored_barrier: timeout={timeout!r} must not be negative")
        with self._monitored_lock:
            step = self._monitored
            self._monitored = step + 1
        arrive, answer = (MONITORED_CHANNEL << 12) | 0, (MONITORED_CHANNEL << 12) | 1
        if self._rank != 0:
            sent = self.endpoint.send(_TOKEN, to=0, step=step, msg=arrive, p=0.0)
            got = self.endpoint.recv(src=0, step=step, msg=answer, p=0.0)
            missing, error = _wait_all({0: got}, seconds)
            if missing:
                cancel_all([got, sent])
                raise timed_out("monitored_barrier", self._rank, [0], seconds, str(error))
            if error is not None:
                raise error
            return
        incoming = {
            q: self.endpoint.recv(src=q, step=step, msg=arrive, p=0.0) for q in range(1, self._size)
        }
        if seconds == 0 and not wait_all_ranks:
            # Gloo's rank 0 checks the time left before it waits for each rank:
            # with none from the start it times out at once, whoever has arrived
            cancel_all(list(incoming.values()))
            raise timed_out(
                "monitored_barrier", 0, [q for q, f in incoming.items() if not f.done()], 0,
                "Rank 0 timed out in monitoredBarrier after 0 ms",
            )  # fmt: skip
        missing, error = _wait_all(incoming, seconds, first_only=not wait_all_ranks)
        if missing:
            cancel_all(list(incoming.values()))
            ms = round(seconds * 1000)
            ranks = ", ".join(map(str, missing))
            who = f"Rank {ranks}" if len(missing) == 1 else f"Ranks {ranks}"
            raise timed_out(
                "monitored_barrier", 0, missing, seconds,
                f"[Rank 0]: {who} failed to pass monitoredBarrier in {ms} ms",
            )  # fmt: skip
        if error is not None:
            raise error
        answers = [
            self.endpoint.send(_TOKEN, to=q, step=step, msg=answer, p=0.0)
            for q in range(1, self._size)
        ]
        _, error = _wait_all(dict(enumerate(answers)), seconds)
        if error is not None:
            raise error


def _wait_all(
    futures: dict[int, Future[Any]], seconds: float, *, first_only: bool = False
) -> tuple[list[int], BaseException | None]:
    """Wait until ``seconds`` from now for every future (by peer): the peers whose
    future timed out or is still pending then (only the first such peer with
    ``first_only``), and the first error seen."""
    deadline = time.monotonic() + seconds
    missing: list[int] = []
    error: BaseException | None = None
    for peer, fut in sorted(futures.items()):
        try:
            fut.result(timeout=max(deadline - time.monotonic(), 0.0))
        except (TimeoutError, PeerTimeout) as exc:
            if isinstance(exc, DLCPTimeout):
                raise
            missing.append(peer)
            error = error or exc
            if first_only:
                break
        except Exception as exc:
            error = error or exc
    return missing, error
