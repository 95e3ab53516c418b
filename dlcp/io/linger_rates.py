"""RATE reports that the receive loop's linger hands to the native engine's pacers.

A receiver reports each sender's rate in a RATE message every 5 to 20 ms, the
most frequent control message there is, and each one the I/O thread reads in
Python ends the receive loop's linger and costs a turn (~0.2 ms of CPU) to set a
few numbers in a pacer of the native engine, which is C. So, where the endpoint
runs both the native receive path and the native engine and does not
authenticate, the linger reads them itself: while it waits for data, a watched
control connection that turns readable has the whole RATE frames at the head of
its socket taken and applied to their source's pacer, without the GIL, and the
linger goes on (``dlcp/io/_control_rates.h`` says which frames: exactly the
untagged RATEs ``decode_control`` accepts from the rank the connection's hello
named). Anything else stays on the socket for Python's read and ends the linger,
as before. Outside the linger, Python reads every frame as it did.

:class:`LingerRates` keeps the table's view in step with the control channel's:
a connection is watched once its hello named its rank and a message on it passed
the session's checks (trusted), and only while Python holds no partial frame of
its stream; it is unwatched before it closes. Each destination's pacer is
registered as the engine makes it. A session that authenticates keeps every
RATE in Python: the loop verifies no control tag, and must not take an untagged
RATE where tags are required.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..proto.session import Session
from .control import ControlChannel, Inbound
from .engine import NativeSender
from .native_receive import MessageRuns

__all__ = ["LingerRates"]


class LingerRates:
    """The RATE frames one endpoint's receive loop takes itself (module docstring)."""

    __slots__ = ("_runs", "wait")

    def __init__(self, runs: MessageRuns, pacer_api: Any, job: int) -> None:
        self._runs = runs
        runs.take_rates(pacer_api, job)
        #: the I/O thread's wait for its files (``ReadSelector.wait_with``): the RATE
        #: frames of a watched connection that turns readable are taken as the linger
        #: takes them, and the wait goes on if that was all (the table's, in C: no
        #: Python frame of its own in a call made every turn)
        self.wait: Callable[[int, int, int], list[int]] = runs.table.wait

    @classmethod
    def start(
        cls,
        runs: MessageRuns | None,
        sender: NativeSender | None,
        session: Session,
        control: ControlChannel,
    ) -> LingerRates | None:
        """Take RATE frames in the linger of ``runs``' receive loop for ``sender``'s
        pacers (each registered as ``sender`` makes it) from ``control``'s inbound
        connections (each forgotten before ``control`` closes it), where that can
        be done: None without the native receive path (``runs``), the native
        engine or its ``PACER_API``, or when ``session`` authenticates. Before any
        pacer is made."""
        authenticates = session.keys is not None or session.config.authenticate
        if runs is None or sender is None or authenticates or sender.pacer_api is None:
            return None
        rates = cls(runs, sender.pacer_api, session.job)
        sender.pacer_made = rates.pacer
        control.closing_inbound = rates.forget
        return rates

    def pacer(self, dst: int, pacer: Any) -> None:
        """``dst``'s RATE reports go to ``pacer`` (the engine's, for sends to ``dst``)."""
        self._runs.rate_pacer(dst, pacer)

    def follow(self, conn: Inbound) -> None:
        """After Python read inbound connection ``conn`` (still open): watch it if
        its rank is known, it is trusted and Python holds none of its bytes."""
        if conn.rank is not None and conn.trusted and not conn.buf:
            self._runs.watch_control(conn.sock.fileno(), conn.rank)
        else:
            self._runs.unwatch_control(conn.sock.fileno())

    def forget(self, fd: int) -> None:
        """Inbound connection ``fd`` is about to close."""
        self._runs.unwatch_control(fd)

    @property
    def taken(self) -> int:
        """RATE reports the linger applied."""
        return self._runs.rates_taken
