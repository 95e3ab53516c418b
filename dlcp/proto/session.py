"""The DLCP session: one endpoint's protocol state, sans I/O.

A :class:`Session` belongs to one rank of one job and talks to any number of
peers. It is driven from outside:

* ``send_message(...)`` / ``expect_message(...)`` — what the application wants;
* ``receive_datagram(data, now=...)`` / ``receive_batch(buf, segment_size, now=...)``
  — bytes that arrived (data records or control messages);
* ``datagrams_to_send(now=...)`` — what to put on the wire: :class:`DataBatch`
  (a contiguous run of fixed-stride data records with its destination, path and
  TOS byte, ready for UDP GSO sends) and :class:`ControlDatagram` (to carry
  on the reliable control channel);
* ``get_timer()`` / ``handle_timer(now=...)`` — the one timer the driver re-arms;
* ``next_event()`` — :class:`MessageReceived`, :class:`MessageDelivered`,
  :class:`MessageFailed`.

Messages are keyed by (peer, step, msg); many are in flight at once in both
directions. Bad datagrams are counted in :attr:`Session.stats` by reason and
dropped; they never disturb other messages.

The session itself is thin: it checks arguments, decodes control messages and
passes each to the side it concerns. The receive side is
:class:`~dlcp.proto.inbox.Inbox`, the send side :class:`~dlcp.proto.outbox.Outbox`;
they share a :class:`~dlcp.proto.context.SessionContext` (identity, config,
counters, events, outgoing control messages).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from .config import FillPolicy, ProtocolConfig
from .context import ALL_ELEMS, PairKeyLookup, PairKeys, SessionContext
from .control import Abort, AbortReason, ControlMessage, Finish, RateFeedback, decode_control
from .events import (
    ControlDatagram,
    DataBatch,
    Event,
    MessageDelivered,
    MessageFailed,
    MessageReceived,
    RoundPost,
    RoundRelease,
    SendReport,
    SessionStats,
    Transmit,
)
from .inbox import Inbox
from .outbox import Outbox
from .pacing import Pacer
from .packetizer import Segments
from .progress import send_progress
from .receive_paths import NativeRuns, Taken
from .wire import PacketType, WireError

__all__ = [
    "ALL_ELEMS",
    "ControlDatagram",
    "DataBatch",
    "Event",
    "MessageDelivered",
    "MessageFailed",
    "MessageReceived",
    "RoundPost",
    "RoundRelease",
    "SendReport",
    "Session",
    "SessionStats",
    "Transmit",
]


class Session:
    """Protocol state of one rank. See the module docstring for how to drive it."""

    def __init__(
        self,
        *,
        rank: int,
        job: int,
        config: ProtocolConfig | None = None,
        key: bytes | PairKeyLookup | None = None,
        peers: Collection[int] | None = None,
        pacer_factory: Callable[[int], Pacer] | None = None,
        whole_rounds: bool = False,
        ordered_rounds: bool = True,
        nonce_start: int = 0,
    ) -> None:
        """``pacer_factory(dst)`` makes the pacer of each destination (default: the
        one ``config`` names); ``whole_rounds`` hands each transmission round out
        whole for the driver to pace and send (:class:`RoundPost`, reported back
        with :meth:`round_sent`; see :mod:`dlcp.proto.outbox`); ``ordered_rounds``:
        the driver sends each round's records in order on each path (one sending
        thread), so that FINISH may name each path's last chunk (docs/spec.md
        §5.3; False with several send threads); ``nonce_start``:
        the first nonce this rank tags with (spec §3; the I/O driver passes the
        wall clock in nanoseconds)."""
        config = config or ProtocolConfig()
        if not 0 <= rank <= 0xFFFF:
            raise UsageError(f"rank={rank} outside 0..65535")
        if not 0 <= job <= 0xFFFF:
            raise UsageError(f"job={job} outside 0..65535")
        if config.authenticate and not key:
            raise UsageError("config.authenticate is on but no key was given")
        if key is not None and not config.authenticate:
            raise UsageError(
                "a key was given but config.authenticate is off: turn authentication on "
                "(ProtocolConfig(authenticate=True)) or give no key"
            )
        self.config = config
        self.rank = rank
        self.job = job
        #: the key (one for every pair) or the lookup of each pair's key; None: no
        #: authentication
        self.key = key
        self.peers = frozenset(peers) if peers is not None else None
        #: the keys this rank tags with and verifies with (spec §3)
        self.keys = (
            PairKeys(rank, key, self.peers, nonce_start=nonce_start) if key is not None else None
        )
        self._ctx = SessionContext(config, rank, job, self.keys)
        self.stats: SessionStats = self._ctx.stats
        #: the events :meth:`next_event` hands out, oldest first; a driver may
        #: test it for emptiness (no call) before it asks for them, and must not
        #: change it
        self.events = self._ctx.events
        self._inbox = Inbox(self._ctx, self.peers)
        self._outbox = Outbox(
            self._ctx,
            pacer_factory=pacer_factory,
            whole_rounds=whole_rounds,
            ordered_rounds=ordered_rounds,
        )
        self._now = 0.0  # latest time a caller passed in (for get_timer)

    # ------------------------------------------------------------------ application

    def send_message(
        self,
        dst: int,
        data: npt.NDArray[np.generic],
        *,
        step: int,
        msg: int,
        now: float,
        segments: Segments | None = None,
        p: float | None = None,
        bfloat16: bool = False,
        borrow: bool = False,
    ) -> None:
        """Queue ``data`` (1-D) for ``dst``. The bytes are copied into packets here,
        so the caller may reuse ``data`` as soon as this returns, unless
        ``borrow`` (see :meth:`Outbox.send`)."""
        if now > self._now:  # (the latest time given; plain comparison, no call)
            self._now = now
        self._check_peer(dst, "send to")
        self._outbox.send(
            dst, data, step=step, msg=msg, now=now, segments=segments, p=p, bfloat16=bfloat16,
            borrow=borrow,
        )  # fmt: skip

    def expect_message(
        self,
        src: int,
        *,
        step: int,
        msg: int,
        out: npt.NDArray[np.generic] | None = None,
        p: float | None = None,
        fill: FillPolicy | None = None,
        accumulate: bool = False,
    ) -> None:
        """Say where message (src, step, msg) goes and how strict to be.

        ``p`` (if given) tightens the sender's bound: the stricter one applies.
        Packets that arrived before this call are moved into ``out``; with
        ``accumulate`` (float32, ``fill`` zero) the message's values are added to
        what ``out`` holds instead (those that arrived before this call too).
        """
        self._check_peer(src, "receive from")
        self._inbox.expect((src, step, msg), out=out, p=p, fill=fill, accumulate=accumulate)

    def cancel(self, peer: int, *, step: int, msg: int, outgoing: bool) -> bool:
        """Abandon a message this rank sends (``outgoing``) or receives; the peer is
        told with ABORT(CANCELLED). True if there was something to cancel. No
        event is emitted for a cancelled message."""
        key = (peer, step, msg)
        # (a receive's end is told to the rate meter at the latest time this session heard)
        if not (self._outbox.cancel(key) if outgoing else self._inbox.cancel(key, now=self._now)):
            return False
        self._ctx.queue(
            peer,
            Abort(step, msg, self.rank, reason=AbortReason.CANCELLED, by_receiver=not outgoing),
        )
        return True

    def progress(self, peer: int, *, step: int, msg: int, outgoing: bool, now: float) -> str:
        """What this rank had seen of a message it sends to (``outgoing``) or
        receives from ``peer``, in words (:mod:`.progress`): for the error of a
        driver that gives up on it. "" for a send it does not know."""
        key = (peer, step, msg)
        if not outgoing:
            return self._inbox.progress(key, now=now)
        dst = self._outbox.peers.get(peer)
        o = dst.outgoing.get(key) if dst is not None else None
        timeout = self.config.finish_timeout  # (the FINISH's timer runs from its last try)
        return "" if o is None else send_progress(o, finish_timeout=timeout, now=now)

    def release(self, src: int, *, step: int, msg: int) -> None:
        """The application took message (src, step, msg), which completed before
        anyone asked for it (or the driver dropped it): the bytes it held stop
        counting against ``config.max_unexpected_bytes``. Until then a received
        message nobody claimed counts as it did while it was coming in."""
        self._inbox.release((src, step, msg))

    def keep_spare(self, data: npt.NDArray[np.generic]) -> None:
        """The driver copied ``data``, a message's own buffer (it completed before
        its receive was posted), into the receive's buffer and holds it no more:
        the session reuses it for the next message of its size that comes early."""
        self._inbox.keep_spare(data)

    # ------------------------------------------------------------------ input

    def receive_datagram(self, data: bytes | bytearray | memoryview, *, now: float) -> None:
        """One datagram from the network or the control channel."""
        if now > self._now:
            self._now = now
        if len(data) and data[0] & 0x0F == PacketType.DATA:
            self.receive_batch(np.frombuffer(data, dtype=np.uint8), len(data), now=now)
            return
        self.stats.datagrams_in += 1
        self.stats.bytes_in += len(data)
        try:
            ctrl = decode_control(
                bytes(data),
                job=self.job,
                key=self.keys.of if self.keys is not None else None,
                require_auth=self.config.authenticate,
            )
        except WireError as exc:
            self.stats.reject(exc.reason.name.lower())
            return
        if self.peers is not None and ctrl.src not in self.peers:
            self.stats.reject("unknown_peer")
            return
        self._on_control(ctrl, now=now)

    def receive_batch(self, buf: npt.NDArray[np.uint8], segment_size: int, *, now: float) -> None:
        """Data datagrams of ``segment_size`` bytes back to back (one UDP GRO read,
        or a run of them), the last one possibly shorter."""
        if now > self._now:
            self._now = now
        self._inbox.receive(buf, segment_size, now=now)

    def take_runs_natively(self, native: NativeRuns) -> None:
        """Let a receive loop run the run path of the messages under way itself
        (:class:`~dlcp.proto.receive_paths.NativeRuns`; ignored when this
        session authenticates and it does not verify tags). Call before any data
        arrives."""
        self._inbox.take_runs_natively(native)

    def receive_taken(self, taken: list[Taken], *, now: float) -> None:
        """What the native receive loop took into the messages under way since it
        last said (:meth:`take_runs_natively`)."""
        if now > self._now:  # (once per receive step: no max() call)
            self._now = now
        self._inbox.receive_taken(taken, now=now)

    def receive_rest(self, buf: npt.NDArray[np.uint8], segment_size: int, *, now: float) -> None:
        """The datagrams of a run after the prefix the native receive loop took
        (back to back, ``segment_size`` apart, the last possibly shorter)."""
        if now > self._now:
            self._now = now
        self._inbox.receive_rest(buf, segment_size, now=now)

    def _on_control(self, ctrl: ControlMessage, *, now: float) -> None:
        if isinstance(ctrl, RateFeedback):
            self._outbox.on_feedback(ctrl, now=now)
            return
        key = (ctrl.src, ctrl.step, ctrl.msg)
        if isinstance(ctrl, Finish):
            self._inbox.on_finish(key, ctrl, now=now)
        elif isinstance(ctrl, Abort) and not ctrl.by_receiver:  # about a message we receive
            if not self._inbox.on_abort(key, ctrl, now=now):
                self.stats.stale_control += 1
        else:  # STOP, NACK, or ABORT by the receiver: about a message we send
            self._outbox.on_control(key, ctrl, now=now)

    # ------------------------------------------------------------------ output

    def datagrams_to_send(self, *, now: float, max_batches: int = 64) -> list[Transmit]:
        """Control messages first, then up to ``max_batches`` data batches the
        pacers allow, highest priority class first for each destination, then
        the control messages those batches queued (the FINISH of a round whose
        last batch went: after its data, in this call, not the next one, which
        may not come until a timer or an input wakes the driver)."""
        if now > self._now:
            self._now = now
        control = self._ctx.control
        if not control and not self._outbox.may_send:  # (a driver asks every turn)
            return []
        out: list[Transmit] = list(control)
        control.clear()
        self._outbox.batches(out, now=now, max_batches=max_batches)
        if self._ctx.control:
            out.extend(self._ctx.control)
            self._ctx.control.clear()
        return out

    def round_sent(
        self,
        dst: int,
        *,
        step: int,
        msg: int,
        began: tuple[float, int],
        last: tuple[float, int],
        now: float,
        finish_sent: bool = False,
    ) -> None:
        """Whole rounds: the driver sent the last record of the round of message
        (``dst``, ``step``, ``msg``) it was given; ``began`` and ``last`` are
        (time, bytes sent to ``dst`` before it) of the round's first and last
        batch. The round's FINISH is queued, unless ``finish_sent``: the driver
        wrote it (:attr:`RoundPost.finish <dlcp.proto.events.RoundPost.finish>`)
        when the round ended, at ``now``."""
        if now > self._now:
            self._now = now
        self._outbox.round_sent(
            (dst, step, msg), began=began, last=last, now=now, finish_sent=finish_sent
        )

    def release_round(self, dst: int, *, step: int, msg: int) -> None:
        """Whole rounds: the driver acted on a :class:`RoundRelease` and holds
        nothing of the message any more."""
        self._outbox.release((dst, step, msg))

    # ------------------------------------------------------------------ timers

    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` must run next (None: nothing pending)."""
        send = self._outbox.next_timer(now=self._now)
        receive = self._inbox.next_timer()
        if send is None:
            return receive
        return send if receive is None or send < receive else receive

    def handle_timer(self, *, now: float, data_pending: bool = False) -> None:
        """Timers due by ``now``. ``data_pending``: datagrams still wait unread in
        the driver's data socket (it runs timers before it has caught up); the
        receive side then waits longer before it NACKs or judges a path silent
        (:meth:`Inbox.handle_timer <dlcp.proto.inbox.Inbox.handle_timer>`)."""
        if now > self._now:
            self._now = now
        self._outbox.handle_timer(now=now)
        self._inbox.handle_timer(now=now, data_pending=data_pending)

    def note_idle(self, seconds: float, *, now: float) -> None:
        """The driver's receive loop waited the ``seconds`` up to ``now`` for
        datagrams: the rate feedback then tells senders what this receiver could
        take, not only what it got (see :class:`~dlcp.proto.rate_meter.RateMeter`)."""
        self._inbox.meter_idle(seconds, now=now)

    # ------------------------------------------------------------------ events

    def next_event(self) -> Event | None:
        events = self.events
        return events.popleft() if events else None

    def path_shares(self, dst: int) -> npt.NDArray[np.float64]:
        """The share of batches each path to ``dst`` gets now (loss-aware)."""
        return self._outbox.path_shares(dst)

    def set_path_weights(self, dst: int, weights: Sequence[float] | None) -> None:
        """The base weights of the paths to ``dst`` (None: equal), under the
        loss-aware shares (:meth:`PathScheduler.set_weights
        <dlcp.proto.paths.PathScheduler.set_weights>`)."""
        self._check_peer(dst, "send to")
        self._outbox.peer(dst).paths.set_weights(weights)

    # ------------------------------------------------------------------ helpers

    def _check_peer(self, rank: int, what: str) -> None:
        if rank == self.rank:
            raise UsageError(f"rank {rank} cannot {what} itself")
        if self.peers is not None and rank not in self.peers:
            raise UsageError(
                f"cannot {what} rank {rank}: not a peer of this session "
                f"(peers: {sorted(self.peers)})"
            )
