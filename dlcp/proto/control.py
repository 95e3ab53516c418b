"""Control-message codec: STOP, FINISH, NACK, RATE and ABORT (``docs/spec.md`` §5).

A control datagram is a 16-byte header (version/type, flags, job, step, msg,
src, body length, reserved) and a type-specific body, optionally followed by the
authentication trailer (8-byte nonce, 16-byte AES-GMAC tag, spec §3).
:func:`decode_control` raises :class:`WireError` with an exact message for
anything malformed. Each message type has one body codec (an encoder and a
decoder) in :data:`CODECS`, keyed by its packet type; the header, its length and
its tag are checked once for all of them.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeAlias

from ..errors import UsageError
from .wire import (
    AUTH_TRAILER_LEN,
    CONTROL_HEADER_LEN,
    MAX_NACK_RANGES,
    VERSION,
    Domain,
    Flags,
    PacketType,
    Reason,
    VerifyKey,
    WireError,
    _check_range,
    key_of_source,
    peek_type,
    seal_datagram,
    tag_matches,
)

__all__ = [
    "CODECS",
    "MAX_FINISH_TAIL",
    "RATE_SHARED",
    "Abort",
    "AbortReason",
    "ControlMessage",
    "Finish",
    "Nack",
    "RateFeedback",
    "Stop",
    "control_source",
    "decode_control",
    "encode_control",
]

_CONTROL_STRUCT: Final = struct.Struct(">BBHIHHHH")
assert _CONTROL_STRUCT.size == CONTROL_HEADER_LEN
_CONTROL_FLAG_MASK: Final = int(Flags.AUTH)
_AUTH: Final = int(Flags.AUTH)
#: RATE's header flag: the rate is the sender's share of a window several senders shared
RATE_SHARED: Final = 0x01
_NACK_MORE: Final = 0x01  # NACK body flags: more parts of this round follow
_U32: Final = struct.Struct(">I")
_FINISH_BODY: Final = struct.Struct(">HHII16I")  # then tail_count x u32 (tail)
#: the most tail chunks a FINISH names: one per path (``n_paths`` <= 256)
MAX_FINISH_TAIL: Final = 256
_NACK_HEAD: Final = struct.Struct(">HBBI")  # round, flags, range count, needed
_RATE_BODY: Final = struct.Struct(">QI")
_ABORT_BODY: Final = struct.Struct(">HH")
_ABORT_BY_RECEIVER: Final = 0x0001  # ABORT flags: the message's receiver abandoned it


class AbortReason(enum.IntEnum):
    GAVE_UP = 1  # the sender's retransmission rounds stopped getting anywhere
    CANCELLED = 2  # the application cancelled the message
    PEER_TIMEOUT = 3  # the other side stopped answering
    DATA_SILENT = 4  # the receiver gets the sender's control messages but none of its data
    UNCLAIMED_LIMIT = 5  # the receiver refused it: nobody asked for it and it would not fit


@dataclass(frozen=True, slots=True)
class _ControlBase:
    step: int
    msg: int
    src: int


@dataclass(frozen=True, slots=True)
class Stop(_ControlBase):
    """Receiver -> sender: the message is complete, stop sending it."""

    received_elems: int = 0


@dataclass(frozen=True, slots=True)
class Finish(_ControlBase):
    """Sender -> receiver: every chunk of this round has been sent.

    ``class_chunks``: chunks per (priority, drop) class at index
    ``prio * 2 + drop``, so the receiver can say what it lost per class.

    ``tail``: the last chunk this round sent on each path it used, when the
    round's records left in order on each path (docs/spec.md §5.3); empty when
    they may not have (several send threads). A receiver that holds every tail
    chunk has all of the round's data that was not lost: it need not wait the
    reorder grace for more.
    """

    round: int = 0
    total_chunks: int = 0
    protected_chunks: int = 0
    class_chunks: tuple[int, ...] = field(default=(0,) * 16)
    tail: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Nack(_ControlBase):
    """Receiver -> sender: chunks missing, and how many more elements are needed."""

    round: int = 0
    needed_elems: int = 0
    ranges: tuple[tuple[int, int], ...] = ()  # (first_seq, count)
    #: more NACK parts of this round follow (a receiver with more gaps than fit
    #: one datagram sends several parts; the sender acts on the last one)
    more: bool = False


@dataclass(frozen=True, slots=True)
class RateFeedback(_ControlBase):
    """Receiver -> sender: the receive rate (bytes/s) it measured from this sender.
    ``shared``: several senders sent in the window, and this is an equal share of
    what they brought (the sender takes it as a cap while they share)."""

    bytes_per_s: int = 0
    interval_us: int = 0
    shared: bool = False


@dataclass(frozen=True, slots=True)
class Abort(_ControlBase):
    """Either direction: the message is abandoned. ``by_receiver``: its receiver
    abandoned it (else its sender). Two ranks that send each other a message of
    the same step and msg have one key for both, so the direction says which."""

    reason: AbortReason = AbortReason.GAVE_UP
    by_receiver: bool = False


ControlMessage: TypeAlias = Stop | Finish | Nack | RateFeedback | Abort


def _length_error(ptype: PacketType, want: int, body_len: int) -> WireError:
    return WireError(
        Reason.LENGTH_MISMATCH,
        f"payload length mismatch: {ptype.name} body must be {want} bytes, has {body_len}",
    )


def _encode_stop(msg: Stop) -> bytes:
    return _U32.pack(msg.received_elems)


def _decode_stop(step: int, msg: int, src: int, body: bytes) -> Stop:
    if len(body) != _U32.size:
        raise _length_error(PacketType.STOP, _U32.size, len(body))
    (received,) = _U32.unpack(body)
    return Stop(step, msg, src, received_elems=received)


def _encode_finish(msg: Finish) -> bytes:
    if len(msg.class_chunks) != 16:
        raise UsageError("Finish.class_chunks needs 16 counts (8 priorities x 2 drop classes)")
    if msg.protected_chunks > msg.total_chunks or sum(msg.class_chunks) != msg.total_chunks:
        raise UsageError(
            f"inconsistent Finish: {msg.protected_chunks} protected and "
            f"{sum(msg.class_chunks)} classed chunks of {msg.total_chunks}"
        )
    if len(msg.tail) > MAX_FINISH_TAIL or any(
        not 0 <= c < msg.total_chunks for c in msg.tail
    ):
        raise UsageError(
            f"Finish.tail {msg.tail!r} must name at most {MAX_FINISH_TAIL} chunks "
            f"of the message's {msg.total_chunks}"
        )
    body = _FINISH_BODY.pack(
        msg.round, len(msg.tail), msg.total_chunks, msg.protected_chunks, *msg.class_chunks
    )
    return body + struct.pack(f">{len(msg.tail)}I", *msg.tail)


def _decode_finish(step: int, msg: int, src: int, body: bytes) -> Finish:
    if len(body) < _FINISH_BODY.size:
        raise _length_error(PacketType.FINISH, _FINISH_BODY.size, len(body))
    rnd, n_tail, total, protected, *classes = _FINISH_BODY.unpack_from(body)
    if n_tail > MAX_FINISH_TAIL:
        raise WireError(
            Reason.BAD_FIELD, f"FINISH names {n_tail} tail chunks, at most {MAX_FINISH_TAIL}"
        )
    size = _FINISH_BODY.size + 4 * n_tail
    if len(body) != size:
        raise _length_error(PacketType.FINISH, size, len(body))
    if protected > total or sum(classes) != total:
        raise WireError(
            Reason.BAD_FIELD,
            f"inconsistent FINISH: {protected} protected and {sum(classes)} classed "
            f"chunks of {total}",
        )
    tail = struct.unpack_from(f">{n_tail}I", body, _FINISH_BODY.size)
    for chunk in tail:
        if chunk >= total:
            raise WireError(
                Reason.BAD_FIELD, f"FINISH tail chunk {chunk} outside the message's {total} chunks"
            )
    return Finish(
        step,
        msg,
        src,
        round=rnd,
        total_chunks=total,
        protected_chunks=protected,
        class_chunks=tuple(classes),
        tail=tail,
    )


def _encode_nack(msg: Nack) -> bytes:
    if len(msg.ranges) > MAX_NACK_RANGES:
        raise UsageError(f"a NACK carries at most {MAX_NACK_RANGES} ranges, got {len(msg.ranges)}")
    for first, n in msg.ranges:
        if n == 0 or first + n > 0xFFFFFFFF:
            raise UsageError(f"NACK range ({first}, {n}) is empty or beyond the seq space")
    flat = [v for r in msg.ranges for v in r]
    return _NACK_HEAD.pack(
        msg.round, _NACK_MORE if msg.more else 0, len(msg.ranges), msg.needed_elems
    ) + struct.pack(f">{len(flat)}I", *flat)


def _decode_nack(step: int, msg: int, src: int, body: bytes) -> Nack:
    body_len = len(body)
    if body_len < _NACK_HEAD.size:
        raise WireError(
            Reason.LENGTH_MISMATCH, f"payload length mismatch: NACK body of {body_len} bytes"
        )
    rnd, nack_flags, count, needed = _NACK_HEAD.unpack_from(body)
    if nack_flags & ~_NACK_MORE:
        raise WireError(
            Reason.BAD_FIELD, f"reserved bits set in NACK body: flags={nack_flags:#04x}"
        )
    if count > MAX_NACK_RANGES:
        raise WireError(
            Reason.LENGTH_MISMATCH,
            f"payload length mismatch: NACK with {count} ranges, "
            f"at most {MAX_NACK_RANGES} fit one datagram",
        )
    if body_len != 8 + 8 * count:
        raise WireError(
            Reason.LENGTH_MISMATCH,
            f"payload length mismatch: NACK with {count} ranges needs "
            f"{8 + 8 * count} body bytes, has {body_len}",
        )
    flat = struct.unpack_from(f">{2 * count}I", body, _NACK_HEAD.size)
    ranges = tuple(zip(flat[0::2], flat[1::2], strict=True))
    for first, n in ranges:
        if n == 0 or first + n > 0xFFFFFFFF:
            raise WireError(
                Reason.OUT_OF_BOUNDS,
                f"offset/length beyond the message: NACK range ({first}, {n})",
            )
    return Nack(
        step,
        msg,
        src,
        round=rnd,
        needed_elems=needed,
        ranges=ranges,
        more=bool(nack_flags & _NACK_MORE),
    )


def _encode_rate(msg: RateFeedback) -> bytes:
    return _RATE_BODY.pack(msg.bytes_per_s, msg.interval_us)


def _decode_rate(step: int, msg: int, src: int, body: bytes) -> RateFeedback:
    if len(body) != _RATE_BODY.size:
        raise _length_error(PacketType.RATE, _RATE_BODY.size, len(body))
    rate, interval = _RATE_BODY.unpack(body)
    return RateFeedback(step, msg, src, bytes_per_s=rate, interval_us=interval)


def _encode_abort(msg: Abort) -> bytes:
    return _ABORT_BODY.pack(int(msg.reason), _ABORT_BY_RECEIVER if msg.by_receiver else 0)


def _decode_abort(step: int, msg: int, src: int, body: bytes) -> Abort:
    if len(body) != _ABORT_BODY.size:
        raise _length_error(PacketType.ABORT, _ABORT_BODY.size, len(body))
    code, flags = _ABORT_BODY.unpack(body)
    if flags & ~_ABORT_BY_RECEIVER:
        raise WireError(Reason.BAD_FIELD, f"reserved bits set in ABORT body: {flags:#06x}")
    try:
        reason = AbortReason(code)
    except ValueError:
        raise WireError(Reason.BAD_FIELD, f"unknown abort reason {code}") from None
    return Abort(step, msg, src, reason=reason, by_receiver=bool(flags & _ABORT_BY_RECEIVER))


@dataclass(frozen=True, slots=True)
class _BodyCodec:
    """How one control message type's body is written and read: ``encode`` gets
    the message, ``decode`` the header's step, msg and src and the body's bytes
    (checking its length, raising :class:`WireError`)."""

    ptype: PacketType
    cls: type
    encode: Callable[[Any], bytes]
    decode: Callable[[int, int, int, bytes], ControlMessage]


#: one codec per control message type, by packet type (the decoder's dispatch)
CODECS: Final[dict[PacketType, _BodyCodec]] = {
    c.ptype: c
    for c in (
        _BodyCodec(PacketType.STOP, Stop, _encode_stop, _decode_stop),
        _BodyCodec(PacketType.FINISH, Finish, _encode_finish, _decode_finish),
        _BodyCodec(PacketType.NACK, Nack, _encode_nack, _decode_nack),
        _BodyCodec(PacketType.RATE, RateFeedback, _encode_rate, _decode_rate),
        _BodyCodec(PacketType.ABORT, Abort, _encode_abort, _decode_abort),
    )
}
#: the same codecs by message class (the encoder's dispatch)
_CODEC_OF_CLASS: Final[dict[type, _BodyCodec]] = {c.cls: c for c in CODECS.values()}
#: the first header byte (version and type) of each control message -> its codec
_CODEC_BY_FIRST_BYTE: Final = {(VERSION << 4) | t: c for t, c in CODECS.items()}


def encode_control(
    msg: ControlMessage, *, job: int, key: bytes | None = None, nonce: int | None = None
) -> bytes:
    """One control datagram; with ``key`` the AUTH flag is set and the trailer
    (``nonce``, from the sender's :class:`~dlcp.proto.auth.NonceCounter` of
    :attr:`~dlcp.proto.auth.Domain.CONTROL`, and the tag) appended."""
    step, msg_id, src = msg.step, msg.msg, msg.src
    if not (
        0 <= job <= 0xFFFF
        and 0 <= step <= 0xFFFFFFFF
        and 0 <= msg_id <= 0xFFFF
        and 0 <= src <= 0xFFFF
    ):
        _check_range("job", job, 0xFFFF)
        _check_range("step", step, 0xFFFFFFFF)
        _check_range("msg", msg_id, 0xFFFF)
        _check_range("src", src, 0xFFFF)
    codec = _CODEC_OF_CLASS[type(msg)]
    body = codec.encode(msg)
    flags = _AUTH if key is not None else 0
    if isinstance(msg, RateFeedback) and msg.shared:
        flags |= RATE_SHARED
    first = (VERSION << 4) | codec.ptype
    head = _CONTROL_STRUCT.pack(first, flags, job, step, msg_id, src, len(body), 0)
    if key is None:
        return head + body
    return seal_datagram(head + body, key, domain=Domain.CONTROL, src=src, nonce=nonce)


def control_source(data: bytes | memoryview) -> int | None:
    """The rank a control datagram claims to come from (its header's ``src``),
    read without checking the rest; None if it is shorter than a control header.
    (A driver matches it against the rank its connection said hello as, before
    the session decodes the message.)"""
    if len(data) < CONTROL_HEADER_LEN:
        return None
    return int(_CONTROL_STRUCT.unpack_from(data)[5])


def decode_control(
    data: bytes | memoryview,
    *,
    job: int,
    key: VerifyKey | None = None,
    require_auth: bool = False,
) -> ControlMessage:
    """Parse and validate one control datagram; raises :class:`WireError`.
    ``key``: one key, or the key of the datagram's claimed source (``src -> key``).
    The header is checked here, the body by its type's codec (:data:`CODECS`)."""
    data = bytes(data)
    codec = _CODEC_BY_FIRST_BYTE.get(data[0]) if data else None
    if codec is None:
        # peek_type raises for anything but a data packet
        peek_type(data)
        raise WireError(
            Reason.BAD_TYPE, "unknown packet type 1 where a control message was expected"
        )
    if len(data) < CONTROL_HEADER_LEN:
        raise WireError(
            Reason.TRUNCATED,
            f"truncated datagram: {len(data)} bytes, a control header needs {CONTROL_HEADER_LEN}",
        )
    _vt, flags, pkt_job, step, msg, src, body_len, reserved = _CONTROL_STRUCT.unpack_from(data)
    if pkt_job != job:
        raise WireError(
            Reason.WRONG_JOB,
            f"wrong job: datagram is for job {pkt_job}, this endpoint serves job {job}",
        )
    allowed = _CONTROL_FLAG_MASK | (RATE_SHARED if codec.ptype is PacketType.RATE else 0)
    if flags & ~allowed or reserved:
        raise WireError(
            Reason.BAD_FIELD,
            f"reserved bits set in control header: flags={flags:#04x}, reserved={reserved:#06x}",
        )
    tag = AUTH_TRAILER_LEN if flags & _AUTH else 0
    if len(data) != CONTROL_HEADER_LEN + body_len + tag:
        raise WireError(
            Reason.LENGTH_MISMATCH,
            f"payload length mismatch: header says {body_len} body bytes "
            f"({CONTROL_HEADER_LEN + body_len + tag} in all), datagram has {len(data)}",
        )
    if key is not None or require_auth:
        if not tag:
            raise WireError(
                Reason.AUTH_REQUIRED, "authentication required: datagram carries no tag"
            )
        if key is not None and (
            (k := key_of_source(key, src)) is None
            or not tag_matches(data, k, domain=Domain.CONTROL, src=src)
        ):
            raise WireError(Reason.AUTH_FAILED, "authentication failed: tag does not match")
    decoded = codec.decode(step, msg, src, data[CONTROL_HEADER_LEN : CONTROL_HEADER_LEN + body_len])
    if flags & RATE_SHARED:
        assert isinstance(decoded, RateFeedback)
        return replace(decoded, shared=True)
    return decoded
