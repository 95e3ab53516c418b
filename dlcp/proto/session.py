"""The DLCP session: one endpoint's protocol state, sans I/O.

A :class:`Session` belongs to one rank of one job and talks to any number of
peers. It is driven from outside:

* ``send_message(...)`` / ``expect_message(...)`` — what the application wants;
* ``receive_datagram(data, now=...)`` / ``receive_batch(buf, segment_size, now=...)``
  — bytes that arrived (data records or control messages);
* ``datagrams_to_send(now=...)`` — what to put on the wire: :class:`DataBatch`
  (a contiguous run of fixed-stride data records with its destination, path and
  TOS byte, ready for one UDP GSO send) and :class:`ControlDatagram` (to carry
  on the reliable control channel);
* ``get_timer()`` / ``handle_timer(now=...)`` — the one timer the driver re-arms;
* ``next_event()`` — :class:`MessageReceived`, :class:`MessageDelivered`,
  :class:`MessageFailed`.

Messages are keyed by (peer, step, msg); many are in flight at once in both
directions. Bad datagrams are counted in :attr:`Session.stats` by reason and
dropped; they never disturb other messages.
"""

from __future__ import annotations

import dataclasses
import struct
from collections import OrderedDict, deque
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .classify import Classifier, make_classifier
from .config import FillPolicy, ProtocolConfig
from .events import (
    ControlDatagram,
    DataBatch,
    Event,
    MessageDelivered,
    MessageFailed,
    MessageReceived,
    SendReport,
    SessionStats,
    Transmit,
)
from .pacing import Pacer, RateMeter, make_pacer
from .packetizer import (
    BufferPool,
    ChunkTable,
    MessageId,
    RecordRun,
    Segments,
    build_records,
    plan_message,
    record_stride,
    seal,
)
from .paths import PathScheduler, path_loss_from_nack
from .reassembler import GeometryError, Reassembler
from .recovery import MAX_NACK_PARTS, ReceiverRecovery, SenderRecovery, SendPhase
from .wire import (
    DATA_HEADER_LEN,
    VERSION,
    Abort,
    AbortReason,
    ControlMessage,
    DType,
    Finish,
    Flags,
    Nack,
    PacketType,
    RateFeedback,
    Reason,
    Stop,
    WireError,
    bound_from_wire,
    bound_to_wire,
    decode_control,
    encode_control,
    parse_batch,
)

__all__ = [
    "ControlDatagram",
    "DataBatch",
    "Event",
    "MessageDelivered",
    "MessageFailed",
    "MessageReceived",
    "SendReport",
    "Session",
    "SessionStats",
    "Transmit",
]

Key = tuple[int, int, int]  # (peer rank, step, msg id)
ALL_ELEMS = 0xFFFFFFFF  # NACK.needed_elems meaning "everything"
#: in Session._completed: the message ended here without delivery (it failed, or
#: the receiver cancelled it), so late packets are ignored (not started as a new
#: message) and a repeated FINISH is answered with ABORT
_FAILED = -2
_CANCELLED = -1

#: the fields of a data header the receive fast path reads from the first
#: datagram of a run: ver_type, flags, job, step, msg, msg_elems, src, dtype
_RUN_HEAD = struct.Struct(">BBHIH2x4x4xI2xHxB")
_DATA_VT = (VERSION << 4) | PacketType.DATA
_PER_PACKET_FLAGS = int(Flags.LAST | Flags.RETRANSMIT)


# --------------------------------------------------------------------------- state


@dataclass(slots=True)
class _Outgoing:
    ident: MessageId
    table: ChunkTable
    recovery: SenderRecovery
    first: RecordRun  # round 0, in send order; source of every retransmission
    row_of_seq: npt.NDArray[np.int64]
    run: RecordRun
    cursor: int = 0
    path_of_seq: npt.NDArray[np.uint8] = field(default_factory=lambda: np.zeros(0, np.uint8))
    round_of_seq: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    nack_parts: list[Nack] = field(default_factory=list)

    @property
    def pending(self) -> bool:
        return self.recovery.phase is SendPhase.SENDING and self.cursor < len(self.run)


@dataclass(slots=True)
class _Incoming:
    reassembler: Reassembler
    recovery: ReceiverRecovery
    unexpected_bytes: int  # buffer bytes charged against max_unexpected_bytes


@dataclass(slots=True)
class _Expectation:
    out: npt.NDArray[np.generic] | None
    p: float | None
    fill: FillPolicy


@dataclass(slots=True)
class _Peer:
    pacer: Pacer
    paths: PathScheduler
    outgoing: dict[Key, _Outgoing] = field(default_factory=dict)
    planned: list[int] = field(default_factory=list)  # paths of the next batches

    def next_path(self) -> int:
        if self.paths.n_paths == 1:
            return 0
        if not self.planned:  # plan a few batches ahead: one scheduler call per 32 batches
            self.planned = self.paths.assign(32).tolist()[::-1]
        return self.planned.pop()

    def replan(self) -> None:
        self.planned.clear()


# --------------------------------------------------------------------------- session


class Session:
    """Protocol state of one rank. See the module docstring for how to drive it."""

    def __init__(
        self,
        *,
        rank: int,
        job: int,
        config: ProtocolConfig | None = None,
        key: bytes | None = None,
        peers: Collection[int] | None = None,
    ) -> None:
        self.config = config or ProtocolConfig()
        if not 0 <= rank <= 0xFFFF:
            raise ValueError(f"rank={rank} outside 0..65535")
        if not 0 <= job <= 0xFFFF:
            raise ValueError(f"job={job} outside 0..65535")
        if self.config.authenticate and not key:
            raise ValueError("config.authenticate is on but no key was given")
        if key is not None and not 16 <= len(key) <= 64:
            raise ValueError(f"authentication key must be 16..64 bytes, got {len(key)}")
        self.rank = rank
        self.job = job
        self.key = key if self.config.authenticate else None
        self.peers = frozenset(peers) if peers is not None else None
        self.stats = SessionStats()
        self._classifier: Classifier = make_classifier(
            self.config.classifier, **self.config.classifier_kwargs()
        )
        self._peers: dict[int, _Peer] = {}
        self._incoming: dict[Key, _Incoming] = {}
        self._expected: dict[Key, _Expectation] = {}
        self._completed: OrderedDict[Key, int] = OrderedDict()  # key -> received elems
        self._orphan_finish: dict[Key, tuple[Finish, float]] = {}
        self._unexpected_bytes = 0
        self._control: list[ControlDatagram] = []
        self._events: deque[Event] = deque()
        self._meter = RateMeter(self.config.rate_interval)
        self._next_peer = 0
        self._pool = BufferPool()
        self._now = 0.0  # latest time a caller passed in (for get_timer)
        self._last_data: dict[int, float] = {}  # source rank -> time its data last arrived

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
    ) -> None:
        """Queue ``data`` (1-D) for ``dst``. The bytes are copied into packets here,
        so the caller may reuse ``data`` as soon as this returns."""
        self._now = max(self._now, now)
        self._check_peer(dst, "send to")
        key = (dst, step, msg)
        peer = self._peer(dst)
        if key in peer.outgoing:
            raise ValueError(f"message (step {step}, msg {msg}) to rank {dst} is already in flight")
        dtype = DType.of(data, bfloat16=bfloat16)
        bound = bound_to_wire(self.config.default_p if p is None else p)
        data = np.ascontiguousarray(data)
        table = plan_message(
            data,
            dtype,
            chunk_bytes=self.config.chunk_bytes,
            classifier=self._classifier,
            segments=segments,
            magnitude_sample=self.config.magnitude_sample,
        )
        ident = MessageId(job=self.job, step=step, msg=msg, src=self.rank, bound=bound)
        order = table.send_order()
        stride = record_stride(table, authenticate=self.key is not None)
        row_of_seq = np.empty(table.n_chunks, dtype=np.int64)
        row_of_seq[order] = np.arange(table.n_chunks)
        first = build_records(
            data.reshape(-1).view(np.uint8),
            table,
            order,
            ident,
            authenticate=self.key is not None,
            buffer=self._pool.take((table.n_chunks, stride)),
            row_of_seq=row_of_seq,
        )
        peer.outgoing[key] = _Outgoing(
            ident=ident,
            table=table,
            recovery=SenderRecovery(table, self.config, now=now),
            first=first,
            row_of_seq=row_of_seq,
            run=first,
            path_of_seq=np.zeros(table.n_chunks, np.uint8),
            round_of_seq=np.zeros(table.n_chunks, np.int32),
        )

    def expect_message(
        self,
        src: int,
        *,
        step: int,
        msg: int,
        out: npt.NDArray[np.generic] | None = None,
        p: float | None = None,
        fill: FillPolicy | None = None,
    ) -> None:
        """Say where message (src, step, msg) goes and how strict to be.

        ``p`` (if given) tightens the sender's bound: the stricter one applies.
        Packets that arrived before this call are moved into ``out``.
        """
        self._check_peer(src, "receive from")
        key = (src, step, msg)
        if key in self._completed:
            how = {_FAILED: "failed", _CANCELLED: "cancelled"}.get(
                self._completed[key], "completed"
            )
            raise ValueError(f"message (step {step}, msg {msg}) from rank {src} already {how}")
        if p is not None:
            bound_to_wire(p)  # validates the range
        fill = fill or self.config.default_fill
        if fill is FillPolicy.PREVIOUS and out is None:
            raise ValueError("fill='previous' needs out= holding the previous values")
        state = self._incoming.get(key)
        if state is None:
            self._expected[key] = _Expectation(out, p, fill)
            return
        r = state.reassembler
        r.fill = fill
        if p is not None and p < r.bound:
            r.bound = p
            r.allowed_loss = int(p * r.msg_elems + 1e-9)
        if out is not None:
            r.replace_output(out)
            self._unexpected_bytes -= state.unexpected_bytes
            state.unexpected_bytes = 0

    def cancel(self, peer: int, *, step: int, msg: int, outgoing: bool) -> bool:
        """Abandon a message this rank sends (``outgoing``) or receives; the peer is
        told with ABORT(CANCELLED). True if there was something to cancel. No
        event is emitted for a cancelled message."""
        key = (peer, step, msg)
        if outgoing:
            p = self._peers.get(peer)
            o = p.outgoing.pop(key, None) if p is not None else None
            if o is None:
                return False
            self._pool.give(o.first.records)
        else:
            state = self._incoming.pop(key, None)
            expected = self._expected.pop(key, None)
            self._orphan_finish.pop(key, None)
            if state is None and expected is None:
                return False
            if state is not None:
                self._unexpected_bytes -= state.unexpected_bytes
            self._remember(key, _CANCELLED)
        self._queue(peer, Abort(step, msg, self.rank, reason=AbortReason.CANCELLED))
        return True

    # ------------------------------------------------------------------ input

    def receive_datagram(self, data: bytes | bytearray | memoryview, *, now: float) -> None:
        """One datagram from the network or the control channel."""
        self._now = max(self._now, now)
        if len(data) and data[0] & 0x0F == PacketType.DATA:
            self.receive_batch(np.frombuffer(data, dtype=np.uint8), len(data), now=now)
            return
        self.stats.datagrams_in += 1
        self.stats.bytes_in += len(data)
        try:
            ctrl = decode_control(
                bytes(data), job=self.job, key=self.key, require_auth=self.config.authenticate
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
        self._now = max(self._now, now)
        if not self.config.authenticate and segment_size >= DATA_HEADER_LEN:
            taken = self._receive_run(buf, segment_size, now=now)
            if not taken and self._opens_message(buf):
                # the first datagram of a message starts it the general way (which
                # checks it and learns the geometry); the rest can then take the
                # fast path, however long the run that arrived in one read
                self._receive_parsed(buf[:segment_size], segment_size, now=now)
                taken = 1 + self._receive_run(buf[segment_size:], segment_size, now=now)
            if taken * segment_size >= len(buf):
                return
            buf = buf[taken * segment_size :]
        self._receive_parsed(buf, segment_size, now=now)

    def _receive_parsed(self, buf: npt.NDArray[np.uint8], segment_size: int, *, now: float) -> None:
        """The general path: parse and validate every datagram (each gets its
        exact reason), group them by message and scatter each group."""
        tail = len(buf) % segment_size if segment_size > 0 else 0
        if tail and len(buf) > segment_size:
            # a short last datagram: parse the full ones in place and the short one
            # on its own, rather than copying the whole run into a padded array
            self._receive_parsed(buf[: len(buf) - tail], segment_size, now=now)
            self._receive_parsed(buf[len(buf) - tail :], segment_size, now=now)
            return
        parsed = parse_batch(
            buf, segment_size, job=self.job, key=self.key, require_auth=self.config.authenticate
        )
        n = len(parsed.reasons)
        self.stats.datagrams_in += n
        self.stats.bytes_in += len(buf)
        ok = parsed.ok
        if not ok.all():
            counts = np.bincount(parsed.reasons[~ok], minlength=len(Reason))
            for code in np.flatnonzero(counts):
                self.stats.reject(Reason(int(code)).name.lower(), int(counts[code]))
            rows = np.flatnonzero(ok)
            if len(rows) == 0:
                return
            headers, payloads = parsed.headers[rows], parsed.payloads[rows]
        else:
            headers, payloads = parsed.headers, parsed.payloads
        src, step, msg = headers["src"], headers["step"], headers["msg"]
        if (src == src[0]).all() and (step == step[0]).all() and (msg == msg[0]).all():
            self._receive_group(
                (int(src[0]), int(step[0]), int(msg[0])), headers, payloads, now=now
            )
            return
        composite = (src.astype(np.uint64) << 48) | (step.astype(np.uint64) << 16) | msg
        keys, inverse = np.unique(composite, return_inverse=True)
        for i, k in enumerate(keys.tolist()):
            sel = inverse == i
            key = (k >> 48, (k >> 16) & 0xFFFFFFFF, k & 0xFFFF)
            self._receive_group(key, headers[sel], payloads[sel], now=now)

    def _opens_message(self, buf: npt.NDArray[np.uint8]) -> bool:
        """Whether ``buf`` starts with a datagram of a message not under way and not
        finished, one that a longer run may follow."""
        if len(buf) < DATA_HEADER_LEN:
            return False
        vt, _, job, step, msg, _, src, _ = _RUN_HEAD.unpack_from(buf.data)
        key = (src, step, msg)
        return (
            vt == _DATA_VT
            and job == self.job
            and key not in self._incoming
            and key not in self._completed
        )

    def _receive_run(self, buf: npt.NDArray[np.uint8], segment_size: int, *, now: float) -> int:
        """The fast path: the leading datagrams of ``buf`` that belong to a message
        already under way and fit it, checked and written in one pass (the C
        kernel's ``scatter_run``). Returns how many it took; the rest, and anything
        unusual (a new message, a bad or foreign datagram, authentication), takes
        the general path, which gives every record its exact reason."""
        if len(buf) < DATA_HEADER_LEN:
            return 0
        vt, flags, job, step, msg, elems, src, dtype = _RUN_HEAD.unpack_from(buf.data)
        if vt != _DATA_VT or job != self.job or flags & ~_PER_PACKET_FLAGS:
            return 0
        key = (src, step, msg)
        state = self._incoming.get(key)
        if state is None or (self.peers is not None and src not in self.peers):
            return 0
        taken, fresh, payload_bytes = state.reassembler.scatter_run(
            buf, segment_size, dtype_byte=dtype, msg_elems=elems, now=now
        )
        if not taken:
            return 0
        self.stats.datagrams_in += taken
        self.stats.datagrams_fast += taken
        self.stats.bytes_in += min(len(buf), taken * segment_size)
        self._last_data[src] = now
        self._meter.on_bytes(src, payload_bytes + taken * DATA_HEADER_LEN, now=now)
        if fresh:
            self._check_complete(key, state, now=now)
        return taken

    def _receive_group(
        self,
        key: Key,
        headers: npt.NDArray[np.void],
        payloads: npt.NDArray[np.uint8],
        *,
        now: float,
    ) -> None:
        n = len(headers)
        if self.peers is not None and key[0] not in self.peers:
            self.stats.reject("unknown_peer", n)
            return
        self._last_data[key[0]] = now
        if key in self._completed:
            self.stats.late_packets += n
            return
        state = self._incoming.get(key) or self._start_incoming(key, headers, now=now)
        if state is None:
            return
        try:
            fresh = state.reassembler.scatter(headers, payloads, now=now)
        except GeometryError:
            # only the packets that do not fit are dropped: a forged one batched
            # with genuine packets (same GRO read) must not take them down with it
            bad = state.reassembler.misfits(headers)
            self.stats.reject("geometry", int(np.count_nonzero(bad)))
            if bad.all():
                return
            headers, payloads = headers[~bad], payloads[~bad]
            n = len(headers)
            fresh = state.reassembler.scatter(headers, payloads, now=now)
        wire_bytes = int(headers["payload_len"].astype(np.int64).sum()) + n * DATA_HEADER_LEN
        self._meter.on_bytes(key[0], wire_bytes, now=now)
        if fresh:
            self._check_complete(key, state, now=now)

    def _start_incoming(
        self, key: Key, headers: npt.NDArray[np.void], *, now: float
    ) -> _Incoming | None:
        # the first packet with a consistent geometry of its own decides the
        # message's; inconsistent ones before it are counted when they misfit
        for h in headers:
            try:
                dtype = DType(int(h["dtype"]) >> 4)
                msg_elems = int(h["msg_elems"])
                chunk_elems = Reassembler.chunk_elems_of(
                    seq=int(h["seq"]),
                    offset=int(h["offset"]),
                    payload_elems=int(h["payload_len"]) // dtype.itemsize,
                    last=bool(h["flags"] & Flags.LAST),
                    msg_elems=msg_elems,
                )
                break
            except GeometryError:
                continue
        else:
            self.stats.reject("geometry", len(headers))
            return None
        want = self._expected.pop(key, None)
        sender_p = bound_from_wire(int(h["bound"]))
        p = sender_p if want is None or want.p is None else min(sender_p, want.p)
        charged = 0
        if want is None or want.out is None:
            charged = msg_elems * dtype.itemsize
            if self._unexpected_bytes + charged > self.config.max_unexpected_bytes:
                self.stats.reject("unexpected_overflow", len(headers))
                if want is not None:
                    self._expected[key] = want
                return None
        try:
            r = Reassembler(
                dtype=dtype,
                msg_elems=msg_elems,
                chunk_elems=chunk_elems,
                out=None if want is None else want.out,
                bound=p,
                fill=self.config.default_fill if want is None else want.fill,
                now=now,
            )
        except (GeometryError, ValueError) as exc:
            self.stats.reject("geometry", len(headers))
            if want is not None:
                self._fail_incoming(key, None, f"packet does not fit the expected message: {exc}")
            return None
        self._unexpected_bytes += charged
        state = _Incoming(r, ReceiverRecovery(r, self.config), charged)
        self._incoming[key] = state
        orphan = self._orphan_finish.pop(key, None)
        if orphan is not None:
            self._apply_finish(key, state, orphan[0], now=now)
        return state

    def _check_complete(self, key: Key, state: _Incoming, *, now: float) -> None:
        r = state.reassembler
        if not r.is_complete():
            return
        if r.received_elems < r.msg_elems:
            # complete by the bound: first let data still in flight behind the
            # FINISH land, so that nothing that was not lost is reported lost
            quiet = r.last_activity + self.config.reorder_grace
            if now < quiet:
                state.recovery.complete_at = quiet
                state.recovery.nack_at = None  # the bound is met: no NACK while waiting
                return
        report = r.complete(now=now)
        del self._incoming[key]
        self._unexpected_bytes -= state.unexpected_bytes
        self._remember(key, r.received_elems)
        self._queue(key[0], Stop(key[1], key[2], self.rank, received_elems=r.received_elems))
        self._events.append(MessageReceived(key[0], key[1], key[2], r.out, report))

    def _remember(self, key: Key, received: int) -> None:
        self._completed[key] = received
        while len(self._completed) > self.config.completed_memory:
            self._completed.popitem(last=False)

    # ------------------------------------------------------------------ control

    def _on_control(self, ctrl: ControlMessage, *, now: float) -> None:
        if isinstance(ctrl, RateFeedback):
            peer = self._peers.get(ctrl.src)
            if peer is not None:
                peer.pacer.on_feedback(float(ctrl.bytes_per_s), now=now)
            return
        key = (ctrl.src, ctrl.step, ctrl.msg)
        if isinstance(ctrl, Finish):
            self._on_finish(key, ctrl, now=now)
        elif isinstance(ctrl, Abort) and key in self._incoming:
            self._fail_incoming(
                key,
                self._incoming.pop(key),
                f"sender aborted the message ({ctrl.reason.name.lower()})",
            )
        elif (
            isinstance(ctrl, Abort)
            and key in self._expected
            and not (ctrl.src in self._peers and key in self._peers[ctrl.src].outgoing)
        ):
            # aborted before any of its data arrived: the application waiting for it
            # must hear of it too
            del self._expected[key]
            self._orphan_finish.pop(key, None)
            self._fail_incoming(
                key, None, f"sender aborted the message ({ctrl.reason.name.lower()})"
            )
        else:
            out = self._peers[ctrl.src].outgoing.get(key) if ctrl.src in self._peers else None
            if out is None:
                self.stats.stale_control += 1
            elif isinstance(ctrl, Stop):
                out.recovery.on_stop(ctrl.received_elems)
                self._finish_outgoing(key, out, now=now)
            elif isinstance(ctrl, Nack):
                self._on_nack(key, out, ctrl, now=now)
            elif isinstance(ctrl, Abort):
                out.recovery.on_abort(f"receiver aborted the message ({ctrl.reason.name.lower()})")
                self._finish_outgoing(key, out, now=now)

    def _on_finish(self, key: Key, finish: Finish, *, now: float) -> None:
        if finish.total_chunks == 0:  # no message has zero chunks (and NACK(0, 0) is invalid)
            self.stats.reject("geometry")
            return
        if key in self._completed:
            received = self._completed[key]
            if received in (_FAILED, _CANCELLED):
                reason = AbortReason.CANCELLED if received == _CANCELLED else AbortReason.GAVE_UP
                self._queue(key[0], Abort(key[1], key[2], self.rank, reason=reason))
            else:
                self._queue(key[0], Stop(key[1], key[2], self.rank, received_elems=received))
            return
        state = self._incoming.get(key)
        if state is None:
            # no data seen yet: FINISH may have overtaken it, or all of it was lost
            self._orphan_finish[key] = (finish, now + self.config.reorder_grace)
            return
        self._apply_finish(key, state, finish, now=now)

    def _apply_finish(self, key: Key, state: _Incoming, finish: Finish, *, now: float) -> None:
        if not state.reassembler.on_finish(finish):
            self.stats.reject("geometry")
            return
        self._check_complete(key, state, now=now)
        if key in self._incoming:
            state.recovery.on_finish(finish.round, now=now)

    def _on_nack(self, key: Key, out: _Outgoing, nack: Nack, *, now: float) -> None:
        rec = out.recovery
        if nack.more or out.nack_parts:
            # a NACK in parts: gather the ranges of this round, act on the last part
            if out.nack_parts and out.nack_parts[0].round != nack.round:
                out.nack_parts.clear()
            out.nack_parts.append(nack)
            if nack.more and len(out.nack_parts) < MAX_NACK_PARTS:
                return  # (a peer that never ends its parts is answered after MAX_NACK_PARTS)
            ranges = tuple(r for part in out.nack_parts for r in part.ranges)
            out.nack_parts.clear()
            nack = dataclasses.replace(nack, ranges=ranges, more=False)
        if rec.phase is SendPhase.AWAITING and nack.round == rec.round:
            missing = np.concatenate(
                [
                    np.arange(f, min(f + c, out.table.n_chunks), dtype=np.int64)
                    for f, c in nack.ranges
                ]
                or [np.zeros(0, np.int64)]
            )
            missing = missing[missing < out.table.n_chunks]
            this_round = np.flatnonzero(out.round_of_seq == rec.round)
            missing = missing[out.round_of_seq[missing] == rec.round]
            sent, lost = path_loss_from_nack(
                out.path_of_seq[this_round],
                np.searchsorted(this_round, missing),
                self.config.n_paths,
            )
            self._peers[key[0]].paths.on_loss_report(sent, lost)
            self._peers[key[0]].replan()
        seqs = rec.on_nack(nack, now=now)
        if rec.phase is SendPhase.FAILED:
            self._queue(key[0], Abort(key[1], key[2], self.rank, reason=AbortReason.GAVE_UP))
            self._finish_outgoing(key, out, now=now)
            return
        if seqs is None:
            self.stats.stale_control += 1
            return
        out.run = build_records(
            out.first.records,
            out.table,
            seqs,
            out.ident,
            authenticate=self.key is not None,
            retransmit=True,
            source_rows=out.row_of_seq,
            source_stride=out.first.stride,
        )
        out.cursor = 0
        rec.retransmitted_packets += len(seqs)
        if len(seqs) == 0:
            self._round_sent(key, out, now=now)

    def _finish_outgoing(self, key: Key, out: _Outgoing, *, now: float) -> None:
        rec = out.recovery
        del self._peers[key[0]].outgoing[key]
        self._pool.give(out.first.records)
        if rec.phase is SendPhase.DONE:
            report = SendReport(
                msg_elems=out.table.msg_elems,
                chunks=out.table.n_chunks,
                sent_packets=rec.sent_packets,
                retransmitted_packets=rec.retransmitted_packets,
                rounds=rec.round,
                acknowledged_elems=rec.received_elems,
                duration=now - rec.started,
            )
            self._events.append(MessageDelivered(key[0], key[1], key[2], report))
        else:
            failure = rec.failure
            assert failure is not None
            self._events.append(
                MessageFailed(
                    key[0],
                    key[1],
                    key[2],
                    True,
                    f"sending to rank {key[0]}: {failure.message}",
                    failure.peer_timeout,
                )
            )

    def _fail_incoming(
        self, key: Key, state: _Incoming | None, why: str, peer_timeout: bool = False
    ) -> None:
        if state is not None:
            self._unexpected_bytes -= state.unexpected_bytes
        self._remember(key, _FAILED)
        self._events.append(
            MessageFailed(
                key[0], key[1], key[2], False, f"receiving from rank {key[0]}: {why}", peer_timeout
            )
        )

    # ------------------------------------------------------------------ output

    def datagrams_to_send(self, *, now: float, max_batches: int = 64) -> list[Transmit]:
        """Control messages first, then up to ``max_batches`` data batches the
        pacers allow, highest priority class first for each destination."""
        self._now = max(self._now, now)
        out: list[Transmit] = list(self._control)
        self._control.clear()
        dsts = [d for d, p in self._peers.items() if any(o.pending for o in p.outgoing.values())]
        if not dsts:
            return out
        start = self._next_peer % len(dsts)
        self._next_peer += 1
        budget = max_batches
        active = dsts[start:] + dsts[:start]
        while active and budget > 0:
            still = []
            for dst in active:  # one batch per destination in turn
                if budget > 0 and self._next_batch(dst, out, now=now):
                    budget -= 1
                    still.append(dst)
            active = still
        return out

    def _next_batch(self, dst: int, out: list[Transmit], *, now: float) -> bool:
        peer = self._peers[dst]
        best: tuple[int, Key, _Outgoing] | None = None
        for key, o in peer.outgoing.items():
            if o.pending:
                prio = int(o.run.prio[o.cursor])
                if best is None or prio > best[0]:
                    best = (prio, key, o)
        if best is None:
            return False
        _, key, o = best
        run, start = o.run, o.cursor
        stop = run.batch_end(start, self.config.batch_packets)
        nbytes = run.batch_nbytes(start, stop)
        if peer.pacer.next_send_time(nbytes, now=now) > now:
            return False
        seqs = run.seq[start:stop]
        o.round_of_seq[seqs] = o.recovery.round
        tos = self.config.tos.tos(int(run.prio[start]), bool(run.drop[start]))
        spray = self.config.spray_packets
        # one path per spray batch: stamped and recorded for the whole run at once
        paths = [peer.next_path() for _ in range(start, stop, spray)]
        if len(paths) == 1 or peer.paths.n_paths == 1:
            per_record: int | npt.NDArray[np.uint8] = paths[0]
        else:
            per_record = np.repeat(np.asarray(paths, np.uint8), spray)[: stop - start]
        if peer.paths.n_paths > 1:
            o.path_of_seq[seqs] = per_record
        if peer.paths.n_paths > 1 or self.key is not None:  # one path: every stamp is 0
            seal(run, start, stop, path=per_record, key=self.key)
        stride = run.stride
        for path, (count, data) in zip(paths, run.spray_batches(start, stop, spray), strict=True):
            out.append(DataBatch(dst, path, tos, stride, count, data))
        peer.pacer.on_sent(nbytes, now=now)
        self.stats.packets_out += stop - start
        self.stats.bytes_out += nbytes
        o.recovery.sent_packets += stop - start
        o.cursor = stop
        if stop == len(run):
            self._round_sent(key, o, now=now)
        return True

    def _round_sent(self, key: Key, o: _Outgoing, *, now: float) -> None:
        o.recovery.round_sent(now=now)
        self._queue(key[0], o.recovery.finish_message(step=key[1], msg=key[2], src=self.rank))

    def _queue(self, dst: int, ctrl: ControlMessage) -> None:
        self._control.append(ControlDatagram(dst, encode_control(ctrl, job=self.job, key=self.key)))

    # ------------------------------------------------------------------ timers

    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` must run next (None: nothing pending)."""
        times: list[float] = []
        for peer in self._peers.values():
            pending_bytes = 0
            for o in peer.outgoing.values():
                if o.recovery.timer is not None:
                    times.append(o.recovery.timer)
                if o.pending and not pending_bytes:
                    stop = o.run.batch_end(o.cursor, self.config.batch_packets)
                    pending_bytes = o.run.batch_nbytes(o.cursor, stop)
            if pending_bytes:
                times.append(peer.pacer.next_send_time(pending_bytes, now=self._now))
        for state in self._incoming.values():
            t = state.recovery.timer
            if t is not None:
                times.append(t)
        times.extend(deadline for _, deadline in self._orphan_finish.values())
        meter = self._meter.next_deadline()
        if meter is not None:
            times.append(meter)
        return min(times) if times else None

    def handle_timer(self, *, now: float) -> None:
        self._now = max(self._now, now)
        for dst, peer in list(self._peers.items()):
            for key, o in list(peer.outgoing.items()):
                if o.recovery.on_timer(now=now):
                    self._queue(
                        dst, o.recovery.finish_message(step=key[1], msg=key[2], src=self.rank)
                    )
                elif o.recovery.phase is SendPhase.FAILED:
                    self._finish_outgoing(key, o, now=now)
        for key, state in list(self._incoming.items()):
            if state.reassembler.is_complete():
                self._check_complete(key, state, now=now)
                continue
            nacks = state.recovery.on_timer(
                now=now,
                step=key[1],
                msg=key[2],
                src=self.rank,
                source_active=self._last_data.get(key[0], float("-inf")),
            )
            if nacks:
                for part in nacks:
                    self._queue(key[0], part)
            elif state.recovery.failure is not None:
                del self._incoming[key]
                self._queue(
                    key[0], Abort(key[1], key[2], self.rank, reason=AbortReason.PEER_TIMEOUT)
                )
                f = state.recovery.failure
                self._fail_incoming(key, state, f.message, f.peer_timeout)
        for key, (finish, deadline) in list(self._orphan_finish.items()):
            quiet = self._last_data.get(key[0], float("-inf")) + self.config.reorder_grace
            if now < quiet:  # this sender's data is still arriving: ours may be behind it
                self._orphan_finish[key] = (finish, quiet)
                continue
            if now >= deadline:
                del self._orphan_finish[key]
                self._queue(
                    key[0],
                    Nack(
                        key[1],
                        key[2],
                        self.rank,
                        round=finish.round,
                        needed_elems=ALL_ELEMS,
                        ranges=((0, finish.total_chunks),),
                    ),
                )
        if self._meter.due(now=now):
            interval_us = int(self.config.rate_interval * 1e6)
            for src, rate in self._meter.sample(now=now).items():
                self._queue(
                    src,
                    RateFeedback(0, 0, self.rank, bytes_per_s=int(rate), interval_us=interval_us),
                )

    def note_idle(self, seconds: float, *, now: float) -> None:
        """The driver's receive loop waited the ``seconds`` up to ``now`` for
        datagrams: the rate feedback then tells senders what this receiver could
        take, not only what it got (see :class:`~dlcp.proto.pacing.RateMeter`)."""
        self._meter.on_idle(seconds, now=now)

    # ------------------------------------------------------------------ events

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def path_shares(self, dst: int) -> npt.NDArray[np.float64]:
        """The share of batches each path to ``dst`` gets now (loss-aware)."""
        return self._peer(dst).paths.effective_weights

    # ------------------------------------------------------------------ helpers

    def _peer(self, dst: int) -> _Peer:
        peer = self._peers.get(dst)
        if peer is None:
            cfg = self.config
            peer = _Peer(
                make_pacer(cfg.pacer, **cfg.pacer_kwargs()),
                PathScheduler(cfg.n_paths, cfg.path_weights),
            )
            self._peers[dst] = peer
        return peer

    def _check_peer(self, rank: int, what: str) -> None:
        if rank == self.rank:
            raise ValueError(f"rank {rank} cannot {what} itself")
        if self.peers is not None and rank not in self.peers:
            raise ValueError(
                f"cannot {what} rank {rank}: not a peer of this session "
                f"(peers: {sorted(self.peers)})"
            )
