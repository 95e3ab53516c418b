"""What a :class:`~dlcp.proto.session.Session` hands out: transmissions, events, stats.

Dataclasses, no behaviour: the I/O driver turns :data:`Transmit` items
into system calls and applications react to :data:`Event` items.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .loss_report import LossReport
from .wire import DATA_HEADER_LEN

__all__ = [
    "ControlDatagram",
    "DataBatch",
    "Event",
    "MessageDelivered",
    "MessageFailed",
    "MessageReceived",
    "RoundPost",
    "RoundRelease",
    "SendReport",
    "SessionStats",
    "Transmit",
]


@dataclass(slots=True)
class DataBatch:
    """Data records for one destination and path, ``segment_size`` bytes apart
    (the last may be shorter): UDP GSO sends of up to 64 KB, or ``count`` plain
    sends. With several paths a session hands out one per ``spray_packets``
    records (the spraying unit); with one path, one per pacing decision.

    ``data`` is a view into the message's record buffer, valid until the next
    call into the session: a STOP, ABORT or cancel hands that buffer back to a
    pool that the next send of the same shape writes over. Send it (or copy it)
    first; a driver that holds batches back must copy them.

    Not frozen, unlike the others (treat it as read-only all the same): a session
    hands out many, and a frozen dataclass costs about three times as much to
    build."""

    dst: int
    path: int
    tos: int
    segment_size: int
    count: int
    data: memoryview


@dataclass(slots=True)
class RoundPost:
    """A whole transmission round of one message for a driver that paces and
    sends by itself (a session made with ``whole_rounds=True``: the native
    engine). ``records`` holds ``count`` datagrams ``stride`` bytes apart, in
    send order (record ``short`` is ``short_len`` bytes, the rest ``stride``;
    ``short`` is -1 when none is shorter); per record its IP TOS byte, path and
    priority class; ``breaks``, the sorted record indexes where a batch must end
    (a class change, just after the short record, the end). The driver sends
    them as the message's pacer allows, in the order the session's own pacing
    would (see ``dlcp.io._engine``), and reports the round with
    :meth:`Session.round_sent`, which queues the round's FINISH (``finish``)
    unless the driver wrote it. ``records`` stays valid until the driver has
    acted on the message's :class:`RoundRelease`.

    Where the sender lent the message's bytes (``payload`` not None), the
    records are headers only, ``DATA_HEADER_LEN`` bytes apart (with ``key``:
    header and trailer, ``DATA_HEADER_LEN + AUTH_TRAILER_LEN`` apart), and
    datagram ``i`` is record ``i``'s header, chunk ``seqs[i]`` of ``payload``
    (``chunk_bytes`` from ``seqs[i] * chunk_bytes``; the short record's
    ``short_len`` minus the record's bytes), then record ``i``'s trailer if
    any; ``stride`` is still the datagrams' size on the wire.

    With ``key`` (an authenticating session) the records carry the AUTH flag and
    room for their trailers but no nonces or tags yet: the driver seals each batch
    as it sends it (spec §3), with nonces from the counter cell ``nonces`` (the
    session's :attr:`~dlcp.proto.auth.NonceCounter.cell`, shared by every thread
    that tags its data). A lent round is sealed where its pieces lie: the
    tag covers header, lent payload and nonce, and goes into the record's
    trailer."""

    dst: int
    step: int
    msg: int
    round: int
    #: the message's place in its sender's send order (earlier messages first)
    order: int
    records: npt.NDArray[np.uint8]
    stride: int
    count: int
    short: int
    short_len: int
    tos: npt.NDArray[np.uint8]
    path: npt.NDArray[np.uint8]
    prio: npt.NDArray[np.uint8]
    breaks: npt.NDArray[np.int64]
    #: the key of the pair (sender, dst) to seal with, None when not authenticating
    key: bytes | None = None
    #: the nonce counter cell to draw nonces from (with ``key``)
    nonces: npt.NDArray[np.uint64] | None = None
    payload: npt.NDArray[np.uint8] | None = None
    seqs: npt.NDArray[np.int64] | None = None
    chunk_bytes: int = 0
    #: the round's FINISH, encoded (and sealed) as the session queues it once the
    #: round is sent; a driver that writes it on the control channel itself after
    #: the round's last record says so to ``round_sent`` (``finish_sent``)
    finish: bytes | None = None

    def datagram(self, i: int) -> bytes:
        """Datagram ``i`` of the round as it goes on the wire (before sealing,
        with ``key``): what a driver sends (the reference for the native
        engine's gathered sends)."""
        size = self.short_len if i == self.short else self.stride
        if self.payload is None:
            return bytes(self.records[i, :size])
        assert self.seqs is not None
        head = self.records.shape[1]
        front = DATA_HEADER_LEN if self.key is not None else head  # (then the trailer)
        at = int(self.seqs[i]) * self.chunk_bytes
        record = self.records[i]
        return (
            bytes(record[:front])
            + bytes(self.payload[at : at + size - head])
            + bytes(record[front:])
        )


@dataclass(frozen=True, slots=True)
class RoundRelease:
    """Message (``dst``, ``step``, ``msg``) ended or was cancelled: the driver
    stops sending what it holds of it, then calls
    :meth:`Session.release_round`, which gives its memory back for reuse."""

    dst: int
    step: int
    msg: int


@dataclass(frozen=True, slots=True)
class ControlDatagram:
    """A control message for the reliable control channel to ``dst``."""

    dst: int
    data: bytes


Transmit = DataBatch | ControlDatagram | RoundPost | RoundRelease


@dataclass(frozen=True, slots=True)
class SendReport:
    msg_elems: int
    chunks: int
    sent_packets: int
    retransmitted_packets: int
    rounds: int
    #: elements the receiver had when it said STOP
    acknowledged_elems: int
    duration: float


@dataclass(frozen=True, slots=True)
class MessageReceived:
    src: int
    step: int
    msg: int
    data: npt.NDArray[np.generic]
    report: LossReport


@dataclass(frozen=True, slots=True)
class MessageDelivered:
    dst: int
    step: int
    msg: int
    report: SendReport


@dataclass(frozen=True, slots=True)
class MessageFailed:
    peer: int
    step: int
    msg: int
    #: True for a message this rank was sending, False for one it was receiving
    outgoing: bool
    reason: str
    peer_timeout: bool = False


Event = MessageReceived | MessageDelivered | MessageFailed


@dataclass(slots=True)
class SessionStats:
    """Counters a user or benchmark can read at any time."""

    datagrams_in: int = 0
    bytes_in: int = 0
    #: data datagrams the one-pass receive path took (the rest took the general path)
    datagrams_fast: int = 0
    packets_out: int = 0
    bytes_out: int = 0
    #: rejected datagrams by reason (wire reasons and session-level ones)
    rejected: dict[str, int] = field(default_factory=dict)
    #: data for messages that already completed (late copies, retransmissions in flight)
    late_packets: int = 0
    #: control messages about messages this session does not know (stale repeats)
    stale_control: int = 0

    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def reject(self, reason: str, count: int = 1) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + count
