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

The I/O thread's loop, the order of its turn and the sending of what the
session produced are the endpoint's base class, :class:`~dlcp.io.io_loop.IOLoop`
(:mod:`dlcp.io.io_loop`); this module holds the endpoint's construction, its
public API and the commands callers run under the lock.

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
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy.typing as npt

from ..errors import ConfigError, EndpointClosed, PeerTimeout, TransferFailed, UsageError
from ..proto.config import FillPolicy
from ..proto.context import PairKeyLookup
from ..proto.pacing import Pacer
from ..proto.paths import weights_for_routes
from ..proto.reassembler import check_accumulate
from ..proto.session import (
    SendReport,
    Session,
)
from ..proto.wire import AUTH_TRAILER_LEN, DType, bound_to_wire
from .arguments import check_auth, check_layers, check_message, check_out, check_rank, flat_message
from .config import EndpointConfig
from .control import ControlChannel
from .control_in_waits import ControlInWaits
from .emulation import LossEmulator
from .engine import NativeSender, choose_engine, send_threads
from .io_loop import IOLoop
from .native_receive import available as native_receive_available
from .native_receive import verifies_tags as native_receive_verifies_tags
from .path_mtu import sized_for_interface
from .path_probe import ProbeResult, RouteProber
from .peers import PeerAddress, PeerBook, Store
from .records import DriverStats, Pending, Received, TransferFuture
from .transfers import Key, Transfers
from .udp import DataSockets

__all__ = ["Endpoint", "PeerAddress", "Received", "Store"]

log = logging.getLogger("dlcp.io")

Segments = Sequence[tuple[int, int, int]]


class Endpoint(IOLoop):
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
        self.config = sized_for_interface(
            config if config is not None else EndpointConfig.from_env()
        )
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
        threads = send_threads(cfg.engine_threads) if self.engine == "native" else 1
        self._sender: NativeSender | None = None
        self._session = Session(
            rank=rank,
            job=job,
            config=protocol,
            key=key,
            peers=known,
            pacer_factory=self._pacer_for if self.engine == "native" else None,
            whole_rounds=self.engine == "native",
            # (several native send threads interleave a round's batches)
            ordered_rounds=threads == 1,
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
        # the connect runs under the endpoint's lock: keep a peer that drops SYNs from
        # stalling every other peer for long (a listening peer answers at once); a
        # control write waits as long for room
        control_timeout = min(cfg.timeout, 2.0)
        try:
            if self.engine == "native":
                self._sender = NativeSender(
                    self._data, protocol, rank=rank, threads=threads,
                    queue_limit=cfg.host_queue_limit, control_timeout=control_timeout,
                )
            elif cfg.engine_threads > 1:  # ("auto" ran the Python engine: config.py)
                log.info("dlcp: engine_threads=%d ignored: the Python engine runs",
                         cfg.engine_threads)  # fmt: skip
            self._control = ControlChannel(
                cfg.host,
                cfg.control_port,
                rank=rank,
                job=job,
                connect_timeout=control_timeout,
                # control messages decide when data moves: the highest priority class
                tos=protocol.tos.tos(7, drop=False),
                rto_min=cfg.control_rto_min,
                keys=self._session.keys,
                address_of=self._control_address,
            )
            # (the engine's threads write each round's FINISH: rule 9 of its source)
            self._control.shared_writes = self._sender
            self.address = PeerAddress(cfg.host, self._data.address[1], self._control.address[1])
            # junk is dropped, and counted, before it reaches the session's parser
            self._data.screen(
                job=job,
                require_auth=protocol.authenticate,
                tag_len=AUTH_TRAILER_LEN,
                in_kernel=cfg.kernel_filter,
            )
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
        self._init_turn_state()
        #: the sends and receives in flight, and messages nobody asked for yet
        self._transfers = Transfers(
            self._session, rank=rank, timeout=cfg.timeout, emulated_loss=cfg.emulated_loss,
            stop_sending=self._sender.cancel if self._sender is not None else None,
        )  # fmt: skip
        self._gone: dict[int, str] = {}
        self._stats = DriverStats()
        self._emulator = (
            LossEmulator(cfg.emulated_loss, cfg.emulated_loss_seed, rank=rank)
            if cfg.emulated_loss
            else None
        )
        # the receive loop scatters the runs of the messages under way itself where
        # it was built and nothing else must see each run in Python: the emulator
        # drops datagrams there; authenticating, the loop must verify tags (libcrypto)
        self._init_native_receive(
            cfg.native_receive
            and native_receive_available()
            and (not protocol.authenticate or native_receive_verifies_tags())
            and self._emulator is None
        )
        #: what probing found of the routes to each peer (dlcp.io.path_probe)
        self._routes: dict[int, dict[str, Any]] = {}
        self._prober = (
            RouteProber(cfg.host, self._data.path_ports, rank=rank, found=self._routes_found)
            if cfg.probe_routes and protocol.n_paths > 1 and protocol.path_weights is None
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
        step, msg = check_message(step, msg)
        message = f"message (step {step}, msg {msg}) to rank {to}"
        flat = flat_message(array, message)
        DType.of(flat, bfloat16=bfloat16)
        check_layers(layers, len(flat), message)
        address = self._resolve(to, message)
        if self._prober is not None:
            self._prober.request(to, address)
        fut: TransferFuture[SendReport] = TransferFuture(
            f"rank {self.rank}: {message}", blocked=self._runs_io,
            waiting=self._in_waits.waiting if self._in_waits is not None else None,
        )  # fmt: skip

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
            self._transfers.pend(key, Pending(fut, now + self.config.timeout), outgoing=True)
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
        accumulate: bool = False,
    ) -> Future[Received]:
        """Receive message (``step``, ``msg``) from rank ``src``, into ``out`` if
        given (1-D, the message's dtype and length). ``p`` can only tighten the
        sender's bound. ``accumulate``: the message's values are added to what
        ``out`` holds instead of written there, each chunk once, as it arrives
        (float32, ``fill='zero'``: a lost element adds nothing). The future gives
        a :class:`Received`."""
        src = check_rank("src", src)  # bad arguments fail now, in the caller
        step, msg = check_message(step, msg)
        message = f"message (step {step}, msg {msg}) from rank {src}"
        if out is not None:
            check_out(out, message)
        fill_policy = FillPolicy(fill) if isinstance(fill, str) else fill
        if accumulate:
            wanted_fill = fill_policy or self.config.protocol.default_fill
            check_accumulate(DType.FLOAT32, wanted_fill, out)
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
                    fut, self._transfers.claim, fut, done, out, p=p, fill=wanted,
                    accumulate=accumulate,
                )  # fmt: skip
                return
            if src in self._gone:
                fut.set_exception(TransferFailed(f"rank {self.rank}: {message}: {self._gone[src]}"))
                return
            try:
                self._session.expect_message(
                    src, step=step, msg=msg, out=out, p=p, fill=fill_policy,
                    accumulate=accumulate,
                )  # fmt: skip
            except ValueError as exc:
                fut.set_exception(exc)
                return
            deadline = time.monotonic() + self.config.timeout
            self._transfers.pend(key, Pending(fut, deadline, out), outgoing=False)
            fut.add_done_callback(functools.partial(self._on_cancel, key, False))

        self._post(command, fut)
        return fut

    def stats(self) -> dict[str, Any]:
        """Counters of the session and the driver (emulated drops labelled as such)."""
        fut: Future[dict[str, Any]] = Future()

        def command() -> None:
            engine = self._sender.stats() if self._sender is not None else {}
            waits = self._in_waits
            fut.set_result(
                {
                    **dataclasses.asdict(self._session.stats),  # the protocol's counters
                    **dataclasses.asdict(self._stats),  # the driver's own counters
                    # with the FINISH frames the engine's threads wrote (rule 9)
                    "control_out": self._stats.control_out + engine.get("engine_finishes", 0),
                    "emulated_loss": self.config.emulated_loss,
                    "emulated_loss_dropped": self._emulator.dropped if self._emulator else 0,
                    "empty_datagrams": self._data.empty_datagrams,
                    # the kernel's drops at the data socket: junk its filter dropped,
                    # and datagrams that found the receive buffer full
                    "kernel_filter": self._data.kernel_filter,
                    "socket_drops": self._data.socket_drops(),
                    "hellos_refused": self._control.hellos_refused,
                    "peers_gone": dict(self._gone),
                    "path_routes": {peer: dict(found) for peer, found in self._routes.items()},
                    "gso": self._data.use_gso,
                    "gro": self._data.use_gro,
                    "engine": self.engine,
                    # the native engine's send threads (None: the Python engine)
                    "engine_threads": self._sender.threads if self._sender else None,
                    "native_receive": self.native_receive,
                    # the control frames the receive loop's waits took
                    **(waits.stats() if waits is not None else ControlInWaits.NO_STATS),
                    **engine,
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
        if self._prober is not None:
            self._prober.close(self.config.timeout)

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ commands

    def _on_cancel(self, key: Key, outgoing: bool, fut: Future[Any]) -> None:
        """Its caller cancelled ``fut``: forget the transfer (the session stops
        sending it, or waiting for it, and tells the peer) unless it had ended."""
        if not fut.cancelled():
            return
        with self._lock:
            if self._closing or not self._transfers.forget(key, outgoing, fut):
                return
        self._wake()  # the I/O thread sends what cancelling queued

    def _pacer_for(self, dst: int) -> Pacer:
        """The native engine's pacer of ``dst`` (the session's pacer factory)."""
        assert self._sender is not None
        return self._sender.pacer_for(dst)

    def _control_address(self, peer: int) -> tuple[str, int] | None:
        """A peer's control address if known (no waiting, no failing the peer)."""
        with contextlib.suppress(Exception):
            if (addr := self._peers.known(peer)) is not None:
                return addr.host, addr.control_port
        return None

    def _resolve(self, peer: int, what: str) -> PeerAddress:
        """Fail now, in the caller, on a rank without an address (waiting at most
        the endpoint's timeout for one that has yet to publish it); at once on a
        rank outside the job, which never will."""
        peers = self._session.peers  # (set when the endpoint was made: no lock)
        if peers is not None and peer not in peers:
            ranks = sorted(peers)
            known = f"0..{ranks[-1]}" if ranks == list(range(len(ranks))) else str(ranks)
            raise UsageError(f"rank {self.rank}: {what}: no rank {peer} in this job ({known})")
        try:
            return self._peers.resolve(peer, timeout=self.config.timeout)
        except PeerTimeout as exc:
            raise PeerTimeout(f"rank {self.rank}: {what}: {exc}") from None

    def _routes_found(self, peer: int, found: ProbeResult) -> None:
        """The prober's result for ``peer``: every distinct route gets the same
        share of the paths to it (from the next batch on)."""
        weights = weights_for_routes(found.routes)
        with self._lock:
            if self._closing:
                return
            if weights is not None:
                self._session.set_path_weights(peer, weights)
            self._routes[peer] = {
                "distance": found.distance,
                "routes": [None if r is None else list(r) for r in found.routes],
                "weights": None if weights is None else list(weights),
                "probes": found.probes,
            }
        routes = {r for r in found.routes if r is not None}
        log.info(
            "rank %d: %d of %d path(s) to rank %d traced, %d distinct route(s) over %s hop(s)%s",
            self.rank, sum(r is not None for r in found.routes), len(found.routes), peer,
            len(routes), found.distance, "; shares evened out" if weights else "",
        )  # fmt: skip

    def _post(self, command: Callable[[], None], fut: Future[Any]) -> None:
        """Run ``command`` (a session operation that settles ``fut`` or leaves it
        pending) in this thread, then send what it produced."""
        with self._lock_wanted:  # the I/O thread lets this caller in (_give_way)
            if not self._callers:
                self._callers_since = time.monotonic()
            self._callers += 1
        if self._lingering:  # (its receive loop waits for data: _receive_data)
            self._wake()
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
                self._send_and_settle(now)  # as in the I/O thread's turn
                # (while the I/O thread is awake it plans its next wait after this; a
                # round it posted that the engine reports without a wake-up does not
                # wake it either: any turn reaps it, and one comes within a second)
                if (
                    self._sleep_until > now
                    and self._next_time(now, self._session.get_timer(), quiet=False)
                    < self._sleep_until
                ):
                    self._wake()
            finally:
                self._holder = outer
