"""RATE reports, STOPs and crossed FINISHes that the receive loop takes from
control connections while the I/O thread waits.

A receiver reports each sender's rate in a RATE message every 5 to 20 ms, the
most frequent control message there is, and each one the I/O thread read in
Python ended the receive loop's linger and cost a turn (~0.2 ms of CPU) to set a
few numbers in a pacer of the native engine, which is C. A STOP ends a send, and
was the sending side's one turn of its own a message. So, where the endpoint
runs both the native receive path and the native engine, the loop reads them
itself wherever the I/O thread waits (the receive call's linger and naps, the
selector's wait): a watched control connection that turns readable has the whole
RATE and STOP frames at the head of its socket taken, without the GIL, and the
wait goes on
(``dlcp/io/_control_frames.h`` says which frames: exactly the RATEs and STOPs
``decode_control`` accepts from the rank the connection's hello named, untagged,
or, in a session that authenticates, tagged with a tag that verifies under the
key of the pair that rank -> this one, as the session verifies them).
Each RATE goes to its source's pacer. Each STOP stops the engine's round of its
message at once (rule 10 of ``dlcp/io/_engine.c``: no more of it goes, and no
FINISH) and is kept for Python, which applies it at the start of its next turn
as if it had read it then (:meth:`ControlInWaits.stops`), before it reads any
control connection; a wait ends :data:`STOP_HOLD` after the first STOP kept at
the latest; while a caller waits for a send's future no STOP is taken, and one
that begins to wait while STOPs are kept wakes the I/O thread
(:meth:`ControlInWaits.waiting`). A FINISH whose message completed here less
than half the FINISH timeout ago (it crossed the receiver's STOP: without loss,
the data alone completes a message before its FINISH comes) is one the inbox
would read and do nothing with: the loop drops it, knowing the messages that
ended here last (:data:`ENDED_KEYS`; the inbox tells it of each). Anything else
stays on the socket for Python's read and ends the wait, as before.

:class:`ControlInWaits` keeps the table's view in step with the control
channel's: a connection is watched once its hello named its rank and a message
on it passed the session's checks (trusted), and only while Python holds no
partial frame of its stream; it is unwatched before it closes. Each
destination's pacer is registered as the engine makes it. In a session that
authenticates, a connection is watched with the key its rank's tags verify under
(``PairKeys.of``: the key the table verifies that rank's data with too); a frame
without a tag, or whose tag does not verify, stays on the socket for Python,
which refuses it as before. That takes a build of ``dlcp.io._udpio`` with
libcrypto (:func:`~dlcp.io.native_receive.verifies_tags`), which the native
receive path needs in such a session anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ..proto.context import PairKeys
from ..proto.session import Session
from .control import ControlChannel, Inbound
from .engine import NativeSender
from .native_receive import MessageRuns

__all__ = ["ENDED_KEYS", "STOP_HOLD", "ControlInWaits"]

#: seconds a STOP taken in a wait waits, at most, for Python's next turn to apply
#: it (a send's future is settled then). Busy, the I/O thread takes a turn well
#: within that for the data it receives; the STOP's own turn is saved. A caller
#: that waits for a send does not wait for this (:meth:`ControlInWaits.waiting`).
STOP_HOLD = 0.002
#: the messages that ended here last, that the loop knows of to drop a FINISH for
#: (the C table's ring; at most the session's own memory, ``completed_memory``)
ENDED_KEYS = 256


class ControlInWaits:
    """The control frames one endpoint's receive loop takes itself (module docstring)."""

    __slots__ = ("_keys", "_runs", "_wake", "wait")

    def __init__(
        self,
        runs: MessageRuns,
        pacer_api: Any,
        job: int,
        wake: Callable[[], None],
        *,
        finish_timeout: float = 0.0,
        completed_memory: int = 1,
        keys: PairKeys | None = None,
    ) -> None:
        self._runs = runs
        self._wake = wake
        #: the session's keys where it authenticates: frames must carry tags that
        #: verify under the key of their source
        self._keys = keys
        runs.take_rates(pacer_api, job, authenticates=keys is not None)
        runs.take_stops(STOP_HOLD)
        if finish_timeout > 0:  # (the inbox answers such a FINISH only from then on)
            runs.take_finishes(finish_timeout / 2, min(ENDED_KEYS, completed_memory))
        #: the I/O thread's wait for its files (``ReadSelector.wait_with``): the frames
        #: of a watched connection that turns readable are taken as the linger takes
        #: them, and the wait goes on if that was all (the table's, in C: no Python
        #: frame of its own in a call made every turn)
        self.wait: Callable[[int, int, int], list[int]] = runs.table.wait

    @classmethod
    def start(
        cls,
        runs: MessageRuns | None,
        sender: NativeSender | None,
        session: Session,
        control: ControlChannel,
        wake: Callable[[], None],
    ) -> ControlInWaits | None:
        """Take RATE and STOP frames, and FINISHes that crossed their STOP, in the
        waits of ``runs``' receive loop for ``sender``'s pacers and rounds (each pacer
        registered as ``sender`` makes it) from ``control``'s inbound connections (each
        forgotten before ``control`` closes it), where that can be done: None without
        the native receive path (``runs``), the native engine or its ``PACER_API``, or
        when ``session`` authenticates (it has keys) and the table verifies no tags.
        ``wake`` wakes the I/O thread. Before any pacer is made."""
        keys = session.keys
        if runs is None or sender is None or sender.pacer_api is None or (
            keys is not None and not runs.verifies_tags
        ):
            return None
        config = session.config
        waits = cls(runs, sender.pacer_api, session.job, wake,
                    finish_timeout=config.finish_timeout,
                    completed_memory=config.completed_memory, keys=keys)  # fmt: skip
        sender.pacer_made = waits.pacer
        control.closing_inbound = waits.forget
        return waits

    def pacer(self, dst: int, pacer: Any) -> None:
        """``dst``'s RATE reports go to ``pacer`` (the engine's, for sends to ``dst``),
        and its STOPs stop that pacer's rounds."""
        self._runs.rate_pacer(dst, pacer)

    def follow(self, conn: Inbound) -> None:
        """After Python read inbound connection ``conn`` (still open): watch it if
        its rank is known, it is trusted and Python holds none of its bytes (and,
        where the session authenticates, there is a key its rank's tags verify
        under)."""
        fd, rank = conn.sock.fileno(), conn.rank
        if rank is not None and conn.trusted and not conn.buf:
            if self._keys is None:
                self._runs.watch_control(fd, rank)
                return
            key = self._keys.of(rank)
            if key is not None:
                self._runs.watch_control(fd, rank, key)
                return
        self._runs.unwatch_control(fd)

    def forget(self, fd: int) -> None:
        """Inbound connection ``fd`` is about to close, or Python reads it now: the
        loop takes nothing more from it (a wait that is taking some returns first)."""
        self._runs.unwatch_control(fd)

    def absorb(self, fd: int) -> bool:
        """Take the frames at the head of watched connection ``fd`` as a wait would;
        whether that was all it had."""
        return bool(self._runs.table.absorb(fd))

    def stops(self) -> list[tuple[int, bytes, float]]:
        """The STOPs taken since the last call, oldest first, for the session:
        (source rank, control datagram, when it was taken)."""
        return self._runs.stops()

    def waiting(self, delta: int) -> None:
        """A caller begins (``delta`` 1) or ends (-1) a wait for a send's future.
        While any waits, the loop leaves STOPs to Python's turn, which settles the
        send at once; one that begins while STOPs are kept wakes the I/O thread to
        apply them now rather than by :data:`STOP_HOLD`."""
        if self._runs.table.waiting(delta) and delta > 0:
            self._wake()

    #: :meth:`stats` of an endpoint whose waits take nothing
    NO_STATS: Final = {"control_rates_native": 0, "control_stops_native": 0,
                       "engine_rounds_stopped": 0, "control_finishes_native": 0}  # fmt: skip

    def stats(self) -> dict[str, int]:
        """What the waits took: RATE reports applied (not in ``control_in``), STOPs
        kept for Python (in ``control_in`` once applied) and the engine's rounds they
        stopped at once, FINISHes dropped (they came after their message completed)."""
        rates, _, stops, stopped, finishes = self._runs.table.control_counts()
        return {"control_rates_native": rates, "control_stops_native": stops,
                "engine_rounds_stopped": stopped, "control_finishes_native": finishes}  # fmt: skip
