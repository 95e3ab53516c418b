"""The input an endpoint's I/O thread reads from its control connections.

:class:`ControlInput`, a base of :class:`~dlcp.io.io_loop.IOLoop`, hands the
frames of each inbound control connection to the session (after the checks
that hold a connection to the rank its hello named), marks a connection trusted
once a message on it passed the session's checks, applies the STOPs the receive
loop's waits took (:mod:`dlcp.io.control_in_waits`) before any connection is
read, offers a ready connection to the loop's table first (what it takes, Python
need not read), and reads what a peer said before it went, so that its last
words count before what is still pending with it fails.
"""

from __future__ import annotations

import selectors
import time
from typing import Any

from ..proto.control import control_source
from ..proto.session import Session
from ..proto.wire import PacketType
from .control import ControlChannel, LostPeer
from .control_in_waits import ControlInWaits
from .records import DriverStats

__all__ = ["ControlInput"]


class ControlInput:
    """Reading inbound control connections (module docstring)."""

    # set up by Endpoint.__init__ and IOLoop (dlcp.io.endpoint, dlcp.io.io_loop)
    _session: Session
    _control: ControlChannel
    _stats: DriverStats
    _selector: selectors.BaseSelector | None
    _in_waits: ControlInWaits | None

    def _peer_gone(self, gone: LostPeer) -> None:
        raise NotImplementedError  # (IOLoop's)

    def _read_control(self, sel: selectors.BaseSelector, sock: Any, *, follow: bool = True) -> bool:
        """One read of inbound control connection ``sock``: its frames handed to
        the session, its end (if it ended) to :meth:`_peer_gone`. Whether the
        read found anything (frames or the end). A connection that ended since
        ``select()`` saw it ready (a command's control send read its peer's last
        words and closed it, see :meth:`_read_control_from`) is nothing to read.
        ``follow``: the receive loop's waits may take its frames again after it."""
        inbound = self._control.inbound.get(sock)
        if inbound is None:
            return False
        frames, ended = self._control.read(sock)
        if ended is not None:
            sel.unregister(sock)
        now = time.monotonic()
        for peer, datagram in frames:
            if self._control_frame(peer, datagram, now):
                inbound.trusted = True
        if ended is not None and (gone := self._control.ended(inbound, ended)) is not None:
            self._peer_gone(gone)
        elif ended is None and follow and self._in_waits is not None:
            self._in_waits.follow(inbound)
        return bool(frames) or ended is not None

    def _control_frame(self, peer: int, datagram: bytes, now: float) -> bool:
        """One control datagram from ``peer`` (its connection's hello named it) to
        the session, read at ``now``; whether it passed the session's checks and
        was not stale (it proves its connection trusted)."""
        self._stats.control_in += 1
        if not datagram or datagram[0] & 0x0F == PacketType.DATA:
            self._stats.control_rejected += 1  # data travels over UDP only
            return False
        claimed = control_source(datagram)
        if claimed is not None and claimed != peer:
            self._stats.control_rejected += 1  # claims another rank than its hello
            return False
        stats = self._session.stats
        # (the counts only grow: a copy of them tells whether it was rejected)
        rejected, stale = dict(stats.rejected), stats.stale_control
        self._session.receive_datagram(datagram, now=now)
        if stats.rejected != rejected:
            self._stats.control_rejected += 1
            return False
        # (a stale message proves nothing: a replay of an old one is stale)
        return stats.stale_control == stale

    def _absorbed(self, sock: Any) -> bool:
        """Whether the frames ready on inbound connection ``sock`` were all ones the
        receive loop's waits take (:mod:`dlcp.io.control_in_waits`), taken now: the
        data read earlier in this turn may have completed the message a FINISH
        waiting behind it is about. The STOPs it kept are applied at once."""
        if self._in_waits is None:
            return False
        taken = self._in_waits.absorb(sock.fileno())
        self._stops_taken()
        return taken

    def _stops_taken(self) -> None:
        """The STOPs the receive loop's waits took since the last turn, applied at
        the time each was taken, before any control connection is read (a frame
        read after one came after it on its connection)."""
        assert self._in_waits is not None
        for peer, datagram, taken_at in self._in_waits.stops():
            self._control_frame(peer, datagram, taken_at)

    def _outbound_ready(self, sock: Any) -> None:
        """A control connection this rank opened turned readable: it ended if its
        peer closed or reset it; a peer whose control port then refuses is gone
        (the end of a dying process's connection can be checked before its
        listener closes: see :mod:`dlcp.io.control`)."""
        gone = self._control.outbound_ended(sock)
        if gone is not None:
            self._read_control_from(gone.rank)
            self._peer_gone(gone)

    def _read_control_from(self, peer: int) -> None:
        """Everything waiting on ``peer``'s inbound control connections, handled
        and matched to its transfers now (not at the next turn)."""
        if self._selector is None:
            return
        socks = [s for s, c in self._control.inbound.items() if c.rank == peer]
        if self._in_waits is not None:  # (what a wait took came first; it takes no more)
            for sock in socks:
                self._in_waits.forget(sock.fileno())
            self._stops_taken()
        for sock in socks:
            while sock in self._control.inbound and self._read_control(
                self._selector, sock, follow=False
            ):
                pass
            if sock in self._control.inbound and self._in_waits is not None:
                self._in_waits.follow(self._control.inbound[sock])
