"""The I/O thread of an :class:`~dlcp.io.endpoint.Endpoint`, and the turn it runs.

:class:`IOLoop` is the endpoint's base class. It owns what happens between the
sockets and the session: the loop of the I/O thread (wait in ``select`` until
the session's timer or the next deadline, take the lock, read the input, run
the due timer, match events to transfers, send what the session produced,
expire what ran past the timeout), the order of one turn's input
(:meth:`IOLoop._take_input`: data first, control and timers held back by a data
backlog for a bounded time), the fairness towards callers waiting for the lock
(:meth:`IOLoop._give_way`), the control listener's tending, and the sending of
the session's output (:meth:`IOLoop._flush`, also run by a caller's command)
with what follows from a send that fails or a peer that is gone.

The public API, the commands callers run under the lock and the endpoint's
construction live in :mod:`dlcp.io.endpoint`; the state both sides share is
declared here and set up by ``Endpoint.__init__``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import selectors
import socket
import threading
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import EndpointClosed, TransferFailed
from ..proto.receive_paths import Taken
from ..proto.session import ControlDatagram, DataBatch, RoundPost, RoundRelease, Session
from .config import EndpointConfig
from .control import ControlChannel, LostPeer
from .control_in_waits import ControlInWaits
from .control_input import ControlInput
from .emulation import LossEmulator
from .engine import NativeSender, RoundReport
from .native_receive import RunHandlers
from .peers import PeerAddress, PeerBook
from .readiness import ReadSelector
from .records import DriverStats
from .threads import name_os_thread
from .transfers import Transfers
from .udp import DataSockets

__all__ = ["IOLoop"]

log = logging.getLogger("dlcp.io")

#: seconds the I/O thread stops watching the control listener after the kernel
#: refused a connection (out of file descriptors, ...)
_ACCEPT_PAUSE = 0.1
#: seconds a data backlog may hold control messages and timers back (_take_input)
_BACKLOG_HOLD = 0.1
#: seconds the I/O thread waits at most for callers to take the lock (_give_way),
#: once one has waited _GIVE_WAY_AFTER for it
_GIVE_WAY = 0.05
_GIVE_WAY_AFTER = 0.002
#: seconds a receive call may go on taking a trickle of data in naps (``EndpointConfig.
#: receive_nap``) before the I/O thread's Python turn (~100 us of CPU), if no deadline of
#: the turn comes first; as long as a steady lone source's rate window by default
#: (``lone_rate_interval``), whose deadline ends it then (5 ms windows' sooner)
TRICKLE_LINGER = 0.02
#: seconds between reads of the data socket's kernel drop counter (a u32 that
#: wraps after 2**32 drops: over 4 billion datagrams a second would be needed)
_DROPS_READ_EVERY = 1.0


class IOLoop(ControlInput):
    """The I/O thread's side of an endpoint. See the module docstring."""

    # set up by Endpoint.__init__ (dlcp.io.endpoint), shared with its commands
    rank: int
    native_receive: bool
    config: EndpointConfig
    _session: Session
    _data: DataSockets
    _control: ControlChannel
    _sender: NativeSender | None
    _peers: PeerBook
    _transfers: Transfers
    _stats: DriverStats
    _emulator: LossEmulator | None
    _wake_r: socket.socket
    _wake_w: socket.socket
    _lock: threading.RLock
    _lock_wanted: threading.Condition
    _callers: int
    _callers_since: float
    _sleep_until: float
    _gone: dict[int, str]
    _closing: bool
    _closed: threading.Event

    def _init_turn_state(self) -> None:
        """The I/O thread's own state, before it starts."""
        #: the I/O thread's selector, once it runs
        self._selector: selectors.BaseSelector | None = None
        #: when to watch the control listener again after a refused accept
        self._accept_resume: float | None = None
        #: before this no inbound connection waiting for its hello times out (inf: none)
        self._hello_due = math.inf
        #: when the I/O thread next reads the data socket's kernel drop counter
        self._drops_due = -math.inf
        #: when control messages and timers last had their turn (_take_input)
        self._control_turn = -math.inf
        #: bytes the current receive handed to the session (the rest was junk)
        self._delivered = 0
        #: the last receive dropped junk (its backlog is not all data)
        self._junk_read = False
        #: the receive loop may wait in C for the next burst (its linger, set by
        #: _init_native_receive); a caller that wants the lock wakes it (_post)
        self._linger = 0.0
        self._nap = 0.0  # (EndpointConfig.receive_nap, where it lingers)
        self._lingering = False
        #: the epoll set of the selector's other files, which end a linger (-1: not yet)
        self._watch = -1

    def _init_native_receive(self, on: bool) -> None:
        """Whether the receive loop scatters the runs of the messages under way
        itself (:mod:`dlcp.io.native_receive`): the session registers them with
        the data sockets' table, whose results go to it."""
        self.native_receive = on
        #: where the native receive path's results go (None: it is off)
        self._native_runs = RunHandlers(self._took, self._rest) if on else None
        if on:
            self._session.take_runs_natively(self._data.take_runs(self._session.job))
        # (the Python engine sends from this thread: it must not wait for data)
        self._linger = self.config.receive_linger if on and self._sender is not None else 0.0
        self._nap = self.config.receive_nap if self._linger else 0.0
        #: the control frames the receive loop's waits take (RATE, STOP, FINISHes that
        #: crossed their STOP: dlcp.io.control_in_waits; None: Python reads them all)
        self._in_waits = ControlInWaits.start(
            self._data.runs if self._linger else None, self._sender, self._session,
            self._control, self._wake,
        )  # fmt: skip

    def _wake(self) -> None:
        """Wake the I/O thread (from a caller's thread)."""
        with contextlib.suppress(OSError):  # already awake (buffer full), or closing
            self._wake_w.send(b"\0")

    def _close_sockets(self) -> None:
        """Every socket this endpoint opened, of those it got to open (the native
        engine's thread first: it sends on the data sockets)."""
        if self._sender is not None:
            self._sender.close()
        for name in ("_data", "_control", "_wake_r", "_wake_w"):
            if (sock := getattr(self, name, None)) is not None:
                sock.close()

    def _stop_engine(self) -> None:
        """Stop the native engine's threads before failing what is pending: a lent
        array is its caller's again once the future settles."""
        if self._sender is not None:
            self._sender.close()

    def _run(self) -> None:
        name_os_thread(f"dlcp-io-{self.rank}")
        sel = self._selector = ReadSelector()
        sel.set_apart(self._data.recv_sock)  # (the receive loop's linger waits on it itself)
        if self._in_waits is not None:  # (and control frames are taken in the wait too)
            sel.wait_with(self._in_waits.wait)
        self._watch = sel.others_fileno()
        sel.register(self._data.recv_sock, selectors.EVENT_READ, "data")
        sel.register(self._control.listener, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self._sender is not None:
            sel.register(self._sender.fileno(), selectors.EVENT_READ, "engine")
        with self._lock:  # (a caller's command may have opened some already)
            self._control.watch_ends(sel)
        session, transfers, sender = self._session, self._transfers, self._sender
        try:
            # a turn with nothing due makes a few dozen Python calls: what only
            # matters when something happened is behind a test of plain values
            while not self._closing:
                if self._callers:  # (read without the condition's lock: see _give_way)
                    self._give_way()
                with self._lock:
                    before = time.monotonic()
                    timer = session.get_timer()
                    self._sleep_until = self._next_time(before, timer)
                wait = self._sleep_until - before
                ready = sel.select(wait if wait > 0.0 else 0.0)
                with self._lock:
                    self._sleep_until = -math.inf
                    now = time.monotonic()
                    if sender is not None and sender.quiet:
                        self._rounds_sent(now)  # (rule 9: before a NACK or STOP about them)
                    if self._in_waits is not None:  # (before any control connection is read)
                        self._stops_taken()
                    session.note_idle(now - before, now=now)  # receive capacity
                    now = self._take_input(sel, ready, timer, now)
                    self._send_and_settle(now)
                    if now >= transfers.earliest:
                        transfers.expire(now)
                    if self._accept_resume is not None or now >= self._hello_due:
                        self._tend_listener(sel, now)
        except BaseException as exc:  # keep the endpoint's users from hanging
            log.exception("dlcp rank %d: I/O thread failed", self.rank)
            failed = TransferFailed(f"rank {self.rank}: I/O thread failed: {exc!r}")
            with self._lock:  # (callers change the tables under it)
                self._stop_engine()
                self._transfers.fail_all(failed)
            raise
        finally:
            with self._lock:
                self._closing = True  # after a crash too: later calls fail instead of hanging
                if self._in_waits is not None:  # STOPs that came before the close count
                    # (after a crash too, unless applying them fails: then they fail below)
                    with contextlib.suppress(Exception):
                        self._stops_taken()
                        self._transfers.dispatch(defer=True)
                self._stop_engine()
                self._transfers.fail_all(EndpointClosed(f"rank {self.rank}: endpoint closed"))
                self._control.watch_ends(None)
                sel.close()
                self._close_sockets()
            self._closed.set()

    def _send_and_settle(self, now: float) -> None:
        """Send what the session produced and settle the transfers its events
        end. Events are matched to their transfers before sending (a send may
        find a peer gone, failing what is still pending with it) and settled
        after it (a receive's STOP is on the wire before its future's callbacks
        run: one may end the process)."""
        events, transfers = self._session.events, self._transfers
        if events:
            transfers.dispatch(defer=True)
        self._flush(now)
        if events or transfers.settlements:
            transfers.dispatch()

    def _give_way(self) -> None:
        """Between turns, let the threads that have waited :data:`_GIVE_WAY_AFTER`
        or more to run a command take the lock first (for at most
        :data:`_GIVE_WAY` seconds). Python's lock is not fair: an I/O thread with
        input at every turn (a flood) takes it back before a woken caller runs,
        which then waits many turns: a ``recv`` posted, and its timeout started,
        seconds late. A caller that gets the lock soon anyway is not waited for:
        that costs a transfer of 1 MB a fifth of its rate on a busy machine."""
        if not self._callers or time.monotonic() - self._callers_since < _GIVE_WAY_AFTER:
            return  # (read without the condition's lock: a stale view costs a turn)
        with self._lock_wanted:
            self._lock_wanted.wait_for(lambda: not self._callers, timeout=_GIVE_WAY)

    def _take_input(
        self,
        sel: selectors.BaseSelector,
        ready: list[tuple[selectors.SelectorKey, int]],
        timer: float | None,
        now: float,
    ) -> float:
        """One turn's input, from ``now`` on; returns the time it ended. The data
        socket first, whether or not ``select`` saw
        it ready (data may have come while this thread waited for the lock), with
        its linger (:meth:`_receive_data`); then
        the other ready sockets; then ``timer``, the session's timer as it was
        before this turn's input (a timer that input set runs next turn: that
        turn's wait is then short or none). The data socket's share is bounded
        (:meth:`DataSockets.receive`'s budget), so every turn ends.

        While the data socket keeps a backlog of data (the receive budget ran
        out, and its reads dropped no junk), control messages and timers wait,
        for at most :data:`_BACKLOG_HOLD` since their last turn: a FINISH or a
        reorder grace judged before the queued data is read would NACK, or
        complete by the bound, data that has arrived. A burst drains within
        that; a backlog that lasts still lets them run that often, and one with
        junk in it (a flood) holds nothing back, so hellos are read, lost data
        is asked for again and timeouts fire on time whatever the data socket
        holds. The sockets stay readable: the next turn comes at once."""
        # (with another file ready the linger would end at once, two calls later)
        only_data = not ready or (len(ready) == 1 and ready[0][0].data == "data")
        self._receive_data(now, timer, may_linger=only_data)
        now = time.monotonic()
        hold = self._holds_back(now)
        other = False  # (another socket's input: the clock is read again after it)
        for key, _ in ready:
            what = key.data
            if what != "data" and not (hold and what == "control"):
                self._on_ready(sel, key.fileobj, what)
                other = True
        if other:
            now = time.monotonic()
        if timer is not None and timer <= now and not hold:
            # (a backlog that held them back this long: its data may be what a
            # NACK would ask for again)
            self._session.handle_timer(now=now, data_pending=self._backlogged())
            now = time.monotonic()
        return now

    def _backlogged(self) -> bool:
        """Whether datagrams of a backlog wait unread (not junk: a flood must not
        hold repairs and verdicts back)."""
        return bool(self._data.backlog) and not self._junk_read

    def _holds_back(self, now: float) -> bool:
        """Whether this turn holds control messages and timers back: the data
        socket has a backlog of data (its last read dropped no junk: waiting for
        junk to drain saves no NACK), and they last had their turn less than
        :data:`_BACKLOG_HOLD` ago (backlogs that drain now and then hold them
        back that long at most)."""
        if self._backlogged() and now - self._control_turn < _BACKLOG_HOLD:
            return True
        self._control_turn = now
        return False

    def _tend_listener(self, sel: selectors.BaseSelector, now: float) -> None:
        """Watch the listener again after a pause; drop inbound connections that
        have not said hello within the timeout (each holds a descriptor). A turn
        calls it only while the listener is paused or once :attr:`_hello_due`
        has passed, which it sets again here."""
        if self._accept_resume is not None and now >= self._accept_resume:
            self._accept_resume = None
            sel.register(self._control.listener, selectors.EVENT_READ, "accept")
        if now < self._hello_due:
            return
        timeout = self.config.timeout
        for sock in self._control.silent_since(now - timeout):
            sel.unregister(sock)
            self._control.drop(sock, f"said no hello within {timeout:g} s")
        waiting = self._control.hello_waits()
        self._hello_due = math.inf if waiting is None else waiting + timeout

    def _next_time(self, now: float, timer: float | None, *, quiet: bool = True) -> float:
        """When the I/O thread has something to do without input: the session's
        ``timer``, a deadline (:attr:`Transfers.earliest
        <dlcp.io.transfers.Transfers.earliest>`: the earliest or, once that
        transfer ended, earlier), the listener's pause or (``quiet``) a FINISH
        timer of a round the engine reports without a wake-up, at most a second
        from ``now``. (Plain comparisons: this runs every turn.)"""
        wake = now + 1.0
        if timer is not None and timer < wake:
            wake = timer
        if self._accept_resume is not None and self._accept_resume < wake:
            wake = self._accept_resume
        sender = self._sender if quiet else None
        due = sender.quiet_due(self._session.config.finish_timeout) if sender else None
        if due is not None and due < wake:  # (not a caller's: its round ends later)
            wake = due
        deadline = self._transfers.earliest
        return deadline if deadline < wake else wake

    def _receive_data(
        self, start: float, timer: float | None = None, *, may_linger: bool = True
    ) -> None:
        """The data socket's share of a turn that began at ``start``: what
        arrived to the session, the pre-filter's drops to its counters.

        With a linger (``EndpointConfig.receive_linger``) the native receive
        loop waits that long in C for the next burst after the socket ran dry,
        but not past the turn's next deadline (``timer`` among them), and not
        while a file of the selector's epoll set other than the data socket is
        readable or a caller waits for the lock (it wakes this thread: _post).
        Data that trickles in it takes in naps (``EndpointConfig.receive_nap``)
        up to :data:`TRICKLE_LINGER`, within the same bounds. The wait counts as
        idle for the rate meter, as ``select``'s does. ``may_linger`` False: no
        linger (another file is ready already, which would end it at once)."""
        self._stats.receive_calls += 1
        self._delivered = 0
        data = self._data
        linger = trickle = self._linger if may_linger else 0.0
        if linger:
            self._lingering = True  # (set before callers is read: see Endpoint._post)
            if self._callers:
                linger = trickle = 0.0
            else:
                until = max(self._next_time(start, timer) - start, 0.0)
                linger, trickle = min(linger, until), min(TRICKLE_LINGER, until)
        read = data.receive(
            self._deliver,
            taken=self._native_runs,
            linger=linger,
            watch=self._watch,
            nap=self._nap,
            trickle=trickle,
        )
        self._lingering = False
        if data.lingered:
            self._session.note_idle(data.lingered, now=time.monotonic())
        if start >= self._drops_due:  # (the kernel's counter wraps: read it now and then)
            data.socket_drops()
            self._drops_due = start + _DROPS_READ_EVERY
        if not data.screened_total:  # (the pre-filter dropped nothing)
            self._junk_read = False
            return
        self._junk_read = True
        for reason, count in data.take_screened().items():
            self._session.stats.reject(reason, count)
        # the share of the receive spent on junk was capacity for data: the rate
        # meter counts it as a wait, as it counts select()'s, so that a flood does
        # not hold the senders to the rate that got through it
        now = time.monotonic()
        junk = (now - start) * (read - self._delivered) / max(read, 1)
        self._session.note_idle(max(0.0, junk), now=now)

    def _on_ready(self, sel: selectors.BaseSelector, sock: Any, what: str) -> None:
        """Input on a socket other than the data socket (:meth:`_receive_data`)."""
        if what == "engine":
            self._rounds_sent()
        elif what == "outbound":
            self._outbound_ready(sock)
        elif what == "wake":
            try:  # (a short read drained it: no second call to hear it is empty)
                while len(self._wake_r.recv(4096)) == 4096:
                    pass
            except (BlockingIOError, InterruptedError):
                pass
        elif what == "accept":
            now = time.monotonic()
            while (conn := self._control.accept(now)) is not None:  # every pending one
                sel.register(conn, selectors.EVENT_READ, "control")
                # (its hello is due within the timeout: _tend_listener drops it else)
                self._hello_due = min(self._hello_due, now + self.config.timeout)
            if self._control.accept_error is not None:
                # the refused connection stays queued and the listener readable: stop
                # watching it for a while instead of spinning (turns resume it)
                sel.unregister(sock)
                self._accept_resume = now + _ACCEPT_PAUSE
        elif not self._absorbed(sock):
            self._read_control(sel, sock)

    def _rounds_sent(self, now: float | None = None) -> None:
        """The native engine's reports (reaped at ``now`` or later): rounds sent or
        failed (the peer's sends fail, as a failed send fails them here)."""
        assert self._sender is not None
        for report in self._sender.reap(now):
            self._round_ended(report)

    def _round_ended(self, r: RoundReport) -> None:
        assert self._sender is not None
        if r.error is not None:
            self._send_failed(r.dst, self._sender.address_of(r.dst), r.error)
        else:  # (rule 9: the engine wrote its FINISH when the round ended)
            self._session.round_sent(r.dst, step=r.step, msg=r.msg, began=r.began, last=r.last,
                                     now=r.ended if r.finish_sent else time.monotonic(),
                                     finish_sent=r.finish_sent)  # fmt: skip

    def _deliver(self, buf: npt.NDArray[np.uint8], segment_size: int) -> None:
        self._delivered += len(buf)
        if self._emulator is not None:
            buf = self._emulator.filter(buf, segment_size)
            if len(buf) == 0:
                return
        self._session.receive_batch(buf, segment_size, now=time.monotonic())

    def _took(self, taken: list[Taken]) -> None:
        """The native receive path's counts (see :class:`RunHandlers`)."""
        for t in taken:
            self._stats.datagrams_native += t[3]
            self._delivered += t[4]
        self._session.receive_taken(taken, now=time.monotonic())

    def _rest(self, buf: npt.NDArray[np.uint8], segment_size: int) -> None:
        self._delivered += len(buf)
        self._session.receive_rest(buf, segment_size, now=time.monotonic())

    def _flush(self, now: float) -> None:
        # bounded, so that receiving gets its turn between bursts of sending
        for _ in range(8):
            items = self._session.datagrams_to_send(now=now, max_batches=64)
            if not items:
                return
            for item in items:
                # (exact classes of dlcp.proto.events, none subclassed: no isinstance calls)
                if type(item) is DataBatch:
                    addr = self._address_of(item.dst)
                    if addr is None:
                        continue
                    try:
                        self._data.send(
                            item.data,
                            item.segment_size,
                            item.count,
                            path=item.path,
                            tos=item.tos,
                            addr=(addr.host, addr.data_port),
                        )
                    except (OSError, ValueError) as exc:  # fail this peer's transfers only
                        self._send_failed(item.dst, f"{addr.host}:{addr.data_port}", exc)
                        continue
                    self._stats.data_batches_out += 1
                elif type(item) is ControlDatagram:
                    self._send_control(item)
                elif type(item) is RoundPost:
                    self._post_round(item)
                elif type(item) is RoundRelease:
                    assert self._sender is not None
                    self._sender.cancel(item.dst, item.step, item.msg)
                    self._session.release_round(item.dst, step=item.step, msg=item.msg)
            now = time.monotonic()

    def _post_round(self, item: RoundPost) -> None:
        assert self._sender is not None
        addr = self._address_of(item.dst)
        if addr is None:  # (nothing went, as a Python-engine batch would not: its
            # FINISH still goes, and the receiver's NACK asks for it again)
            now = time.monotonic()
            self._session.round_sent(
                item.dst, step=item.step, msg=item.msg, began=(now, 0), last=(now, 0), now=now
            )
            return
        try:
            ended = self._sender.post(item, (addr.host, addr.data_port), now=time.monotonic())
        except ValueError as exc:  # (an address the engine cannot send to)
            self._send_failed(item.dst, f"{addr.host}:{addr.data_port}", exc)
            return
        self._stats.data_batches_out += 1
        if ended is not None:  # all of it went at once: its FINISH is due now
            self._round_ended(ended)

    def _send_failed(self, dst: int, where: str, why: object) -> None:
        """Sending data to ``dst`` failed: its sends fail (this peer's only)."""
        self._stats.data_send_errors += 1
        self._transfers.fail_peer(dst, f"sending data to {where} failed: {why}", receives=False)

    def _send_control(self, item: ControlDatagram) -> None:
        if item.dst in self._gone:
            return
        addr = self._address_of(item.dst)
        if addr is None:
            return
        gone = self._control.send(item.dst, (addr.host, addr.control_port), item.data)
        self._stats.control_out += 1
        if gone is not None:
            # the peer may have answered before it left: its STOP for the message
            # this FINISH was about can wait unread in its connection to us (a
            # turn that held control back, or a peer that closed as soon as its
            # receive completed). What it said counts first; what is still
            # pending with it then fails.
            self._read_control_from(gone.rank)
            self._peer_gone(gone)

    def _address_of(self, peer: int) -> PeerAddress | None:
        """A peer's address, under the lock, without waiting: a peer that sent
        us something has published its address already. A rank that has not
        (a stray or forged datagram named it) gets nothing sent, and the I/O
        thread does not wait on the store for it (it did, for the store's own
        timeout, with the lock held)."""
        try:
            addr = self._peers.known(peer)
        except Exception as exc:
            self._peer_gone(LostPeer(peer, f"rank {peer} has no known address: {exc}"))
            return None
        if addr is None:
            self._stats.unroutable += 1
        return addr

    def _peer_gone(self, gone: LostPeer) -> None:
        # what the peer said before it went (a STOP read in the same turn) is
        # matched to its transfers first: only what is still pending fails
        self._transfers.dispatch(defer=True)
        if gone.rank not in self._gone:
            waiting = self._transfers.waits_on(gone.rank)
            # a peer that leaves while nothing is pending with it is a normal shutdown
            log.log(
                logging.WARNING if waiting else logging.INFO,
                "dlcp rank %d: %s",
                self.rank,
                gone.why,
            )
        self._gone[gone.rank] = gone.why
        self._transfers.fail_peer(gone.rank, gone.why)
