"""``Endpoint``: DLCP on real sockets, the object applications use.

One endpoint per rank. It owns a protocol :class:`~dlcp.proto.session.Session`,
the UDP data sockets, the TCP control channel, and one I/O thread. Application
threads call :meth:`Endpoint.send` and :meth:`Endpoint.recv`, which return a
:class:`concurrent.futures.Future` at once.

One lock guards the session, the sockets and the pending futures. The I/O
thread holds it except while it waits: it waits on the sockets until the
session's timer or the next deadline; feeds what arrived to the session; runs
its timer; matches its events to the pending transfers; sends what it produced;
completes those transfers' futures; fails what ran past ``config.timeout``. It
never spins while idle. A calling thread's command ends the same way (match,
send, complete). So a future completes only after the control messages queued
with its event have gone to the kernel: a receive's STOP is sent before the
receive's future is done, and a receiver may exit as soon as it has its message.

``send`` and ``recv`` do their work in the calling thread, under the lock: a
send is planned, packed and put on the wire (as far as the pacer allows) before
``send`` returns, without handing over to the I/O thread and waiting for it to
be scheduled (two context switches per message on a busy machine). The caller
wakes the I/O thread only when the session now needs it earlier than it planned
to wake: the rest of a paced message, or a timer.

Buffers: ``send`` copies the array into packets before it returns (as
:meth:`Session.send_message` does), so the caller may change or reuse it at
once; the collectives rely on that (a ring scales, and later receives into,
chunks it has sent). ``recv(out=...)`` writes ``out`` (from the I/O thread, or
from a thread calling the endpoint) until its future is done, or is cancelled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, EndpointClosed, PeerTimeout, TransferFailed, UsageError
from ..proto.config import FillPolicy
from ..proto.context import PairKeyLookup
from ..proto.control import control_source
from ..proto.pacing import Pacer
from ..proto.session import (
    ControlDatagram,
    DataBatch,
    RoundPost,
    RoundRelease,
    SendReport,
    Session,
)
from ..proto.wire import AUTH_TRAILER_LEN, DType, PacketType, bound_to_wire
from .arguments import check_auth, check_layers, check_message, check_out, check_rank, flat_message
from .config import EndpointConfig
from .control import ControlChannel, LostPeer
from .emulation import LossEmulator
from .engine import NativeSender, RoundReport, choose_engine
from .peers import PeerAddress, PeerBook, Store
from .records import DriverStats, Pending, Received, TransferFuture
from .threads import name_os_thread
from .transfers import Key, Transfers
from .udp import DataSockets

__all__ = ["Endpoint", "PeerAddress", "Received", "Store"]

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

Segments = Sequence[tuple[int, int, int]]


class Endpoint:
    """DLCP endpoint of one rank. See the module docstring."""

    def __init__(
        self,
        rank: int,
        peers: Mapping[int, PeerAddress | tuple[str, int, int]] | None = None,
        *,
        job: int = 0,
        config: EndpointConfig | None = None,
        key: bytes | PairKeyLookup | None = None,
        store: Store | None = None,
        world_size: int | None = None,
    ) -> None:
        self.config = config if config is not None else EndpointConfig.from_env()
        self.rank = rank = check_rank("rank", rank)
        self.job = job
        check_auth(self.config, key, rank)
        if peers is None and store is None:
            raise ConfigError("an Endpoint needs peers={rank: address} or store=")
        known: set[int] | None = None
        if world_size is not None:
            if not 0 <= rank < world_size:
                raise ConfigError(f"rank={rank} outside 0..{world_size - 1}")
            known = set(range(world_size))
        self._peers = PeerBook(rank, job, peers, store)
        if known is None and store is None:
            known = set(self._peers.addresses) | {rank}
        cfg = self.config
        protocol = cfg.protocol
        # a sender gives up on a silent receiver after the endpoint's timeout, not before
        retries = max(protocol.finish_retries, math.ceil(cfg.timeout / protocol.finish_timeout))
        protocol = dataclasses.replace(protocol, finish_retries=retries)
        #: "native" or "python": what sends the data (dlcp.io.engine)
        self.engine = choose_engine(cfg.engine, authenticate=protocol.authenticate)
        self._sender: NativeSender | None = None
        self._session = Session(
            rank=rank,
            job=job,
            config=protocol,
            key=key,
            peers=known,
            pacer_factory=self._pacer_for if self.engine == "native" else None,
            whole_rounds=self.engine == "native",
            nonce_start=time.time_ns(),  # spec §3: above any nonce of an earlier run
        )
        self._data = DataSockets(
            cfg.host,
            cfg.data_port,
            cfg.protocol.n_paths,
            gso=cfg.gso,
            gro=cfg.gro,
            rcvbuf=cfg.rcvbuf,
            sndbuf=cfg.sndbuf,
        )
        try:
            if self.engine == "native":
                self._sender = NativeSender(self._data, protocol, rank=rank)
            self._control = ControlChannel(
                cfg.host,
                cfg.control_port,
                rank=rank,
                job=job,
                # the connect runs under the endpoint's lock: keep a peer that drops SYNs
                # from stalling every other peer for long (a listening peer answers at once)
                connect_timeout=min(cfg.timeout, 2.0),
                # control messages decide when data moves: the highest priority class
                tos=protocol.tos.tos(7, drop=False),
                rto_min=cfg.control_rto_min,
                keys=self._session.keys,
                address_of=self._control_address,
            )
            self.address = PeerAddress(cfg.host, self._data.address[1], self._control.address[1])
            # junk is dropped, and counted, before it reaches the session's parser
            self._data.screen(job=job, require_auth=protocol.authenticate, tag_len=AUTH_TRAILER_LEN)
            self._peers.publish(self.address)  # (the store may fail)
            self._wake_r, self._wake_w = socket.socketpair()
        except BaseException:
            self._close_sockets()
            raise
        self._wake_r.setblocking(False)
        # a full buffer already wakes the I/O thread: a wake must not block (a
        # writer under the lock would wait for a reader that needs the lock)
        self._wake_w.setblocking(False)
        #: guards the session, the sockets and the tables below (module docstring);
        #: re-entrant: a future's callback may send or receive
        self._lock = threading.RLock()
        #: threads waiting to take the lock for a command, and their signal to the
        #: I/O thread once they have it (_give_way)
        self._callers = 0
        self._callers_since = math.inf  # when the first of them began to wait
        self._lock_wanted = threading.Condition(threading.Lock())
        #: the application thread running a command under the lock (callbacks of
        #: the futures it settles run there too), if one is
        self._holder: int | None = None
        #: when the waiting I/O thread wakes up by itself (-inf: it is not waiting)
        self._sleep_until = -math.inf
        #: the I/O thread's selector, once it runs
        self._selector: selectors.BaseSelector | None = None
        #: when to watch the control listener again after a refused accept
        self._accept_resume: float | None = None
        #: when control messages and timers last had their turn (_take_input)
        self._control_turn = -math.inf
        #: bytes the current receive handed to the session (the rest was junk)
        self._delivered = 0
        #: the last receive dropped junk (its backlog is not all data)
        self._junk_read = False
        #: the sends and receives in flight, and messages nobody asked for yet
        self._transfers = Transfers(
            self._session, rank=rank, timeout=cfg.timeout, emulated_loss=cfg.emulated_loss
        )
        self._gone: dict[int, str] = {}
        self._stats = DriverStats()
        self._emulator = (
            LossEmulator(cfg.emulated_loss, cfg.emulated_loss_seed, rank=rank)
            if cfg.emulated_loss
            else None
        )
        self._closing = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"dlcp-io-{rank}", daemon=True)
        try:
            self._thread.start()
        except BaseException:  # (no thread to be had)
            self._close_sockets()
            raise

    def _runs_io(self) -> bool:
        """Whether this thread is the I/O thread or holds the lock for a command."""
        return threading.get_ident() in (self._thread.ident, self._holder)

    def _close_sockets(self) -> None:
        """Every socket this endpoint opened, of those it got to open (the native
        engine's thread first: it sends on the data sockets)."""
        if self._sender is not None:
            self._sender.close()
        for name in ("_data", "_control", "_wake_r", "_wake_w"):
            if (sock := getattr(self, name, None)) is not None:
                sock.close()

    # ------------------------------------------------------------------ API

    def send(
        self,
        array: npt.NDArray[Any],
        *,
        to: int,
        msg: int,
        step: int = 0,
        layers: Segments | None = None,
        p: float | None = None,
        bfloat16: bool = False,
        borrow: bool = False,
    ) -> Future[SendReport]:
        """Send ``array`` (flattened) to rank ``to``; its bytes are copied before
        this returns. The future gives the :class:`SendReport` once the receiver
        has it within its bound.

        ``borrow=True`` lends ``array`` instead, on the native engine (the
        Python engine copies it as usual): the engine reads each datagram's
        payload from it while the message lasts (authenticating, it tags the
        datagram there too), which saves the copy into packets. Write it only
        where the receiver has completed the message (a collective's later
        steps), or after the future is done."""
        to = check_rank("to", to)  # bad arguments fail now, in the caller
        check_message(step, msg)
        message = f"message (step {step}, msg {msg}) to rank {to}"
        flat = flat_message(array, message)
        DType.of(flat, bfloat16=bfloat16)
        check_layers(layers, len(flat), message)
        self._resolve(to, message)
        fut: TransferFuture[SendReport] = TransferFuture(
            f"rank {self.rank}: {message}", blocked=self._runs_io
        )

        def command() -> None:
            key = (to, step, msg)
            if key in self._transfers.sends:
                fut.set_exception(
                    UsageError(
                        f"message (step {step}, msg {msg}) to rank {to} is already in flight"
                    )
                )
                return
            now = time.monotonic()
            try:
                self._session.send_message(
                    to, flat, step=step, msg=msg, now=now, segments=layers, p=p,
                    bfloat16=bfloat16, borrow=borrow,
                )  # fmt: skip
            except ValueError as exc:
                fut.set_exception(exc)
                return
            self._transfers.sends[key] = Pending(fut, now + self.config.timeout)
            fut.add_done_callback(functools.partial(self._on_cancel, key, True))
            if to in self._gone:
                self._transfers.fail_peer(to, self._gone[to])

        self._post(command, fut)
        return fut

    def recv(
        self,
        *,
        src: int,
        msg: int,
        step: int = 0,
        out: npt.NDArray[Any] | None = None,
        p: float | None = None,
        fill: FillPolicy | str | None = None,
    ) -> Future[Received]:
        """Receive message (``step``, ``msg``) from rank ``src``, into ``out`` if
        given (1-D, the message's dtype and length). ``p`` can only tighten the
        sender's bound. The future gives a :class:`Received`."""
        src = check_rank("src", src)  # bad arguments fail now, in the caller
        check_message(step, msg)
        message = f"message (step {step}, msg {msg}) from rank {src}"
        if out is not None:
            check_out(out, message)
        fill_policy = FillPolicy(fill) if isinstance(fill, str) else fill
        self._resolve(src, message)
        fut: TransferFuture[Received] = TransferFuture(
            f"rank {self.rank}: {message}", blocked=self._runs_io
        )

        def command() -> None:
            key = (src, step, msg)
            if key in self._transfers.recvs:
                fut.set_exception(
                    UsageError(f"already receiving (step {step}, msg {msg}) from rank {src}")
                )
                return
            if p is not None:
                try:  # before a completed message is taken out of the table
                    bound_to_wire(p)
                except ValueError as exc:
                    fut.set_exception(exc)
                    return
            # a completion may still sit in the session's queue (settled, as a
            # claim below is, once _post has sent what is queued: a STOP first)
            self._transfers.dispatch(defer=True)
            done = self._transfers.take_unclaimed(key)
            if done is not None:
                wanted = fill_policy or self.config.protocol.default_fill
                self._transfers.queue_settlement(
                    fut, self._transfers.claim, fut, done, out, p=p, fill=wanted
                )
                return
            if src in self._gone:
                fut.set_exception(TransferFailed(f"rank {self.rank}: {message}: {self._gone[src]}"))
                return
            try:
                self._session.expect_message(
                    src, step=step, msg=msg, out=out, p=p, fill=fill_policy
                )
            except ValueError as exc:
                fut.set_exception(exc)
                return
            self._transfers.recvs[key] = Pending(fut, time.monotonic() + self.config.timeout, out)
            fut.add_done_callback(functools.partial(self._on_cancel, key, False))

        self._post(command, fut)
        return fut

    def stats(self) -> dict[str, Any]:
        """Counters of the session and the driver (emulated drops labelled as such)."""
        fut: Future[dict[str, Any]] = Future()

        def command() -> None:
            fut.set_result(
                {
                    **dataclasses.asdict(self._session.stats),  # the protocol's counters
                    **dataclasses.asdict(self._stats),  # the driver's own counters
                    "emulated_loss": self.config.emulated_loss,
                    "emulated_loss_dropped": self._emulator.dropped if self._emulator else 0,
                    "empty_datagrams": self._data.empty_datagrams,
                    "hellos_refused": self._control.hellos_refused,
                    "peers_gone": dict(self._gone),
                    "gso": self._data.use_gso,
                    "gro": self._data.use_gro,
                    "engine": self.engine,
                    **(self._sender.stats() if self._sender is not None else {}),
                }
            )

        self._post(command, fut)
        return fut.result(timeout=self.config.timeout)

    def close(self) -> None:
        """Stop the I/O thread, fail what is pending, release every socket."""
        if not self._closing:
            self._closing = True
            self._wake()
        # (also after a crash); not from a callback on the I/O thread or under the
        # lock, which the I/O thread needs to finish: it finishes afterwards then
        if not self._runs_io():
            self._thread.join(self.config.timeout)
            if self._thread.is_alive():  # (a callback that blocks it: say so, not hang)
                log.error("rank %d: close(): the I/O thread did not stop", self.rank)

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _on_cancel(self, key: Key, outgoing: bool, fut: Future[Any]) -> None:
        """Its caller cancelled ``fut``: forget the transfer (the session stops
        sending it, or waiting for it, and tells the peer) unless it had ended."""
        if not fut.cancelled():
            return
        with self._lock:
            if self._closing or not self._transfers.forget(key, outgoing, fut):
                return
        self._wake()  # the I/O thread sends what cancelling queued

    def _resolve(self, peer: int, what: str) -> None:
        """Fail now, in the caller, on a rank without an address (waiting at most
        the endpoint's timeout for one that has yet to publish it); at once on a
        rank outside the job, which never will."""
        peers = self._session.peers  # (set when the endpoint was made: no lock)
        if peers is not None and peer not in peers:
            ranks = sorted(peers)
            known = f"0..{ranks[-1]}" if ranks == list(range(len(ranks))) else str(ranks)
            raise UsageError(f"rank {self.rank}: {what}: no rank {peer} in this job ({known})")
        try:
            self._peers.resolve(peer, timeout=self.config.timeout)
        except PeerTimeout as exc:
            raise PeerTimeout(f"rank {self.rank}: {what}: {exc}") from None

    def _post(self, command: Callable[[], None], fut: Future[Any]) -> None:
        """Run ``command`` (a session operation that settles ``fut`` or leaves it
        pending) in this thread, then send what it produced."""
        with self._lock_wanted:  # the I/O thread lets this caller in (_give_way)
            if not self._callers:
                self._callers_since = time.monotonic()
            self._callers += 1
        with self._lock:
            with self._lock_wanted:
                self._callers -= 1
                self._lock_wanted.notify_all()
            if self._closing:
                fut.set_exception(EndpointClosed(f"rank {self.rank}: endpoint is closed"))
                return
            outer, self._holder = self._holder, threading.get_ident()
            try:
                command()
                now = time.monotonic()
                self._transfers.dispatch(defer=True)  # as in the I/O thread's turn
                self._flush(now)
                self._transfers.dispatch()
                # (while the I/O thread is awake it plans its next wait after this)
                if (
                    self._sleep_until > now
                    and self._next_time(now, self._session.get_timer()) < self._sleep_until
                ):
                    self._wake()
            finally:
                self._holder = outer

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # already awake (buffer full), or closing
            self._wake_w.send(b"\0")

    # ------------------------------------------------------------------ I/O thread

    def _run(self) -> None:
        name_os_thread(f"dlcp-io-{self.rank}")
        sel = self._selector = selectors.DefaultSelector()
        sel.register(self._data.recv_sock, selectors.EVENT_READ, "data")
        sel.register(self._control.listener, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self._sender is not None:
            sel.register(self._sender.fileno(), selectors.EVENT_READ, "engine")
        try:
            while not self._closing:
                self._give_way()
                with self._lock:
                    before = time.monotonic()
                    timer = self._session.get_timer()
                    self._sleep_until = self._next_time(before, timer)
                ready = sel.select(max(0.0, self._sleep_until - before))
                with self._lock:
                    self._sleep_until = -math.inf
                    now = time.monotonic()
                    self._session.note_idle(now - before, now=now)  # receive capacity
                    self._take_input(sel, ready, timer)
                    now = time.monotonic()
                    # events are matched to their transfers before sending (a send may
                    # find a peer gone, failing what is still pending with it) and
                    # settled after it (a receive's STOP is on the wire before its
                    # future's callbacks run: one may end the process)
                    self._transfers.dispatch(defer=True)
                    self._flush(now)
                    self._transfers.dispatch()
                    self._transfers.expire(now)
                    self._tend_listener(sel, now)
        except BaseException as exc:  # keep the endpoint's users from hanging
            log.exception("dlcp rank %d: I/O thread failed", self.rank)
            failed = TransferFailed(f"rank {self.rank}: I/O thread failed: {exc!r}")
            with self._lock:  # (callers change the tables under it)
                self._transfers.fail_all(failed)
            raise
        finally:
            with self._lock:
                self._closing = True  # after a crash too: later calls fail instead of hanging
                self._transfers.fail_all(EndpointClosed(f"rank {self.rank}: endpoint closed"))
                sel.close()
                self._close_sockets()
            self._closed.set()

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
    ) -> None:
        """One turn's input: the data socket first, whether or not ``select`` saw
        it ready (data may have come while this thread waited for the lock); then
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
        self._on_ready(sel, self._data.recv_sock, "data")
        hold = self._holds_back(time.monotonic())
        for key, _ in ready:
            if key.data != "data" and not (hold and key.data == "control"):
                self._on_ready(sel, key.fileobj, key.data)
        now = time.monotonic()
        if timer is not None and timer <= now and not hold:
            self._session.handle_timer(now=now)

    def _holds_back(self, now: float) -> bool:
        """Whether this turn holds control messages and timers back: the data
        socket has a backlog of data (its last read dropped no junk: waiting for
        junk to drain saves no NACK), and they last had their turn less than
        :data:`_BACKLOG_HOLD` ago (backlogs that drain now and then hold them
        back that long at most)."""
        if (
            self._data.backlog
            and not self._junk_read
            and now - self._control_turn < _BACKLOG_HOLD
        ):
            return True
        self._control_turn = now
        return False

    def _tend_listener(self, sel: selectors.BaseSelector, now: float) -> None:
        """Watch the listener again after a pause; drop inbound connections that
        have not said hello within the timeout (each holds a descriptor)."""
        if self._accept_resume is not None and now >= self._accept_resume:
            self._accept_resume = None
            sel.register(self._control.listener, selectors.EVENT_READ, "accept")
        for sock in self._control.silent_since(now - self.config.timeout):
            sel.unregister(sock)
            self._control.drop(sock, f"said no hello within {self.config.timeout:g} s")

    def _next_time(self, now: float, timer: float | None) -> float:
        """When the I/O thread has something to do without input: the session's
        ``timer``, a deadline or the listener's pause, at most a second from ``now``."""
        times = [now + 1.0]
        if timer is not None:
            times.append(timer)
        if self._accept_resume is not None:
            times.append(self._accept_resume)
        if (deadline := self._transfers.next_deadline()) is not None:
            times.append(deadline)
        return min(times)

    def _on_ready(self, sel: selectors.BaseSelector, sock: Any, what: str) -> None:
        if what == "data":
            self._stats.receive_calls += 1
            start, self._delivered = time.monotonic(), 0
            read = self._data.receive(self._deliver)
            screened = self._data.take_screened()  # the pre-filter's drops
            self._junk_read = bool(screened)
            if screened:
                for reason, count in screened.items():
                    self._session.stats.reject(reason, count)
                # the share of the receive spent on junk was capacity for data: the
                # rate meter counts it as a wait, as it counts select()'s, so that a
                # flood does not hold the senders to the rate that got through it
                now = time.monotonic()
                junk = (now - start) * (read - self._delivered) / max(read, 1)
                self._session.note_idle(max(0.0, junk), now=now)
        elif what == "engine":
            self._rounds_sent()
        elif what == "wake":
            try:
                while self._wake_r.recv(4096):
                    pass
            except (BlockingIOError, InterruptedError):
                pass
        elif what == "accept":
            now = time.monotonic()
            while (conn := self._control.accept(now)) is not None:  # every pending one
                sel.register(conn, selectors.EVENT_READ, "control")
            if self._control.accept_error is not None:
                # the refused connection stays queued and the listener readable: stop
                # watching it for a while instead of spinning (turns resume it)
                sel.unregister(sock)
                self._accept_resume = now + _ACCEPT_PAUSE
        else:
            self._read_control(sel, sock)

    def _read_control(self, sel: selectors.BaseSelector, sock: Any) -> bool:
        """One read of inbound control connection ``sock``: its frames handed to
        the session, its end (if it ended) to :meth:`_peer_gone`. Whether the
        read found anything (frames or the end)."""
        inbound = self._control.inbound[sock]
        frames, ended = self._control.read(sock)
        if ended is not None:
            sel.unregister(sock)
        now = time.monotonic()
        for peer, datagram in frames:
            self._stats.control_in += 1
            if not datagram or datagram[0] & 0x0F == PacketType.DATA:
                self._stats.control_rejected += 1  # data travels over UDP only
                continue
            claimed = control_source(datagram)
            if claimed is not None and claimed != peer:
                self._stats.control_rejected += 1  # claims another rank than its hello
                continue
            stats = self._session.stats
            rejected, stale = stats.rejected_total(), stats.stale_control
            self._session.receive_datagram(datagram, now=now)
            if stats.rejected_total() != rejected:
                self._stats.control_rejected += 1
            elif stats.stale_control == stale:
                # (a stale message proves nothing: a replay of an old one is stale)
                inbound.trusted = True
        if ended is not None and (gone := self._control.ended(inbound, ended)) is not None:
            self._peer_gone(gone)
        return bool(frames) or ended is not None

    def _pacer_for(self, dst: int) -> Pacer:
        assert self._sender is not None
        return self._sender.pacer_for(dst)

    def _rounds_sent(self) -> None:
        """The native engine's reports: rounds sent (their FINISH is due) or
        failed (the peer's sends fail, as a failed send fails them here)."""
        assert self._sender is not None
        for report in self._sender.reap():
            self._round_ended(report)

    def _round_ended(self, r: RoundReport) -> None:
        assert self._sender is not None
        if r.error is not None:
            self._send_failed(r.dst, self._sender.address_of(r.dst), r.error)
        else:
            self._session.round_sent(
                r.dst, step=r.step, msg=r.msg, began=r.began, last=r.last, now=time.monotonic()
            )

    def _deliver(self, buf: npt.NDArray[np.uint8], segment_size: int) -> None:
        self._delivered += len(buf)
        if self._emulator is not None:
            buf = self._emulator.filter(buf, segment_size)
            if len(buf) == 0:
                return
        self._session.receive_batch(buf, segment_size, now=time.monotonic())

    def _flush(self, now: float) -> None:
        # bounded, so that receiving gets its turn between bursts of sending
        for _ in range(8):
            items = self._session.datagrams_to_send(now=now, max_batches=64)
            if not items:
                return
            for item in items:
                if isinstance(item, DataBatch):
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
                elif isinstance(item, ControlDatagram):
                    self._send_control(item)
                elif isinstance(item, RoundPost):
                    self._post_round(item)
                elif isinstance(item, RoundRelease):
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
            ended = self._sender.post(item, (addr.host, addr.data_port))
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

    def _read_control_from(self, peer: int) -> None:
        """Everything waiting on ``peer``'s inbound control connections, handled
        and matched to its transfers now (not at the next turn)."""
        if self._selector is None:
            return
        for sock in [s for s, c in self._control.inbound.items() if c.rank == peer]:
            while sock in self._control.inbound and self._read_control(self._selector, sock):
                pass

    def _control_address(self, peer: int) -> tuple[str, int] | None:
        """A peer's control address if known (no waiting, no failing the peer)."""
        with contextlib.suppress(Exception):
            if (addr := self._peers.known(peer)) is not None:
                return addr.host, addr.control_port
        return None

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
