"""DLCP wire format: the layout every codec shares (headers, fields, tags).

This module holds what data records and control messages have in common: the
constants, the data header's layout, the enums of its fields, the reasons a
datagram is rejected and the tag. It imports no other codec module; the codecs
build on it, each in its own module and none importing another's:

* :mod:`dlcp.proto.batch`: data datagrams (:func:`parse_batch`,
  :func:`~dlcp.proto.batch.decode_data`);
* :mod:`dlcp.proto.control`: control messages (one body codec per type).

Everything here follows ``docs/spec.md`` byte for byte; the scapy layer in
:mod:`dlcp.inspect` and the P4 header are checked against the same golden vectors.

Two views of the same bytes:

* **Batches** of data records are numpy structured arrays (:data:`HEADER_DTYPE`
  over fixed-stride records) so that many headers are filled or checked in one
  vectorised operation. ``parse_batch`` validates a whole batch and returns a
  per-record reason code instead of raising, so that one bad datagram never
  stops the good ones around it.
* **Single datagrams** (tests, inspection, control messages) are frozen
  dataclasses; ``decode_data`` and ``decode_control`` raise
  :class:`WireError` with an exact message for anything malformed.

Rules that hold everywhere:

* all integers are big-endian (network order);
* the data header is exactly :data:`DATA_HEADER_LEN` (32) bytes, the control
  header :data:`CONTROL_HEADER_LEN` (16) bytes;
* an authenticated datagram carries the AUTH flag and ends with an 8-byte nonce
  and a :data:`AUTH_TAG_LEN` (16) byte AES-GMAC tag over everything before the
  tag (:mod:`dlcp.proto.auth`);
* reserved bits are sent as zero and rejected when set, so that later versions
  can give them a meaning without old receivers misreading them.
"""

from __future__ import annotations

import enum
import hmac
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

from ..errors import DLCPError, UsageError
from .auth import (
    AUTH_NONCE_LEN,
    AUTH_TAG_LEN,
    AUTH_TRAILER_LEN,
    Domain,
    NonceCounter,
    check_auth_key,
    gmac_tag,
)

__all__ = [
    "AUTH_NONCE_LEN",
    "AUTH_TAG_LEN",
    "AUTH_TRAILER_LEN",
    "CONTROL_HEADER_LEN",
    "DATA_HEADER_LEN",
    "DEFAULT_PORT",
    "HEADER_DTYPE",
    "MAX_LOSS_BOUND",
    "MAX_NACK_RANGES",
    "NATIVE_HEADER_DTYPE",
    "VERSION",
    "DType",
    "DataHeader",
    "Domain",
    "Flags",
    "NonceCounter",
    "PacketType",
    "Reason",
    "TosMap",
    "VerifyKey",
    "WireError",
    "allowed_loss",
    "bound_from_wire",
    "bound_to_wire",
    "check_auth_key",
    "check_message_key",
    "encode_data",
    "gmac_tag",
    "key_of_source",
    "message_header",
    "peek_type",
    "seal_datagram",
    "tag_matches",
]

VERSION: Final = 1
#: UDP port of the data path unless configured otherwise
DEFAULT_PORT: Final = 9400
DATA_HEADER_LEN: Final = 32
CONTROL_HEADER_LEN: Final = 16
#: largest loss bound a data header can carry (the field counts thousandths)
MAX_LOSS_BOUND: Final = 0.255
#: NACK ranges per control datagram: a chosen cap (1408 bytes with a nonce and tag,
#: below any MTU-1500 path)
MAX_NACK_RANGES: Final = 170


class PacketType(enum.IntEnum):
    DATA = 1
    STOP = 2
    FINISH = 3
    NACK = 4
    RATE = 5
    ABORT = 6


class Flags(enum.IntFlag):
    NONE = 0
    LAST = 0x01
    RETRANSMIT = 0x02
    AUTH = 0x04


_DATA_FLAG_MASK: Final = int(Flags.LAST | Flags.RETRANSMIT | Flags.AUTH)


class DType(enum.IntEnum):
    """Element type of a message; bfloat16 travels as raw 16-bit words."""

    FLOAT32 = 0
    FLOAT16 = 1
    BFLOAT16 = 2
    UINT8 = 3

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @classmethod
    def of(cls, array: npt.NDArray[np.generic], *, bfloat16: bool = False) -> DType:
        """The wire dtype of a numpy array (uint16 arrays are bfloat16 words)."""
        dt = array.dtype
        if dt == np.float32:
            return cls.FLOAT32
        if dt == np.float16:
            return cls.FLOAT16
        if dt == np.uint16 and bfloat16:
            return cls.BFLOAT16
        if dt == np.uint8:
            return cls.UINT8
        raise UsageError(
            f"unsupported element type {dt}: DLCP carries float32, float16, "
            "bfloat16 (as uint16 words with bfloat16=True) and uint8"
        )

    def numpy(self) -> np.dtype[np.generic]:
        return _NUMPY_DTYPE[self]


_ITEMSIZE: Final = {DType.FLOAT32: 4, DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.UINT8: 1}
_NUMPY_OF: Final = {
    DType.FLOAT32: np.float32,
    DType.FLOAT16: np.float16,
    DType.BFLOAT16: np.uint16,
    DType.UINT8: np.uint8,
}
_NUMPY_DTYPE: Final = {d: np.dtype(t) for d, t in _NUMPY_OF.items()}
_ITEMSIZE_BY_CODE: Final[npt.NDArray[np.int64]] = np.array([4, 2, 2, 1] + [0] * 12, dtype=np.int64)


class Reason(enum.IntEnum):
    """Why a datagram was rejected. ``OK`` marks an accepted record."""

    OK = 0
    TRUNCATED = 1
    BAD_VERSION = 2
    BAD_TYPE = 3
    WRONG_JOB = 4
    LENGTH_MISMATCH = 5
    OUT_OF_BOUNDS = 6
    BAD_FIELD = 7
    AUTH_REQUIRED = 8
    AUTH_FAILED = 9


class WireError(DLCPError, ValueError):
    """The one exception parsing raises; ``reason`` says which rule was broken."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# --------------------------------------------------------------------------- header

#: the data header as a numpy structured dtype (big-endian), 32 bytes
HEADER_DTYPE: Final[np.dtype[np.void]] = np.dtype(
    [
        ("ver_type", "u1"),
        ("flags", "u1"),
        ("job", ">u2"),
        ("step", ">u4"),
        ("msg", ">u2"),
        ("layer", ">u2"),
        ("seq", ">u4"),
        ("offset", ">u4"),
        ("msg_elems", ">u4"),
        ("payload_len", ">u2"),
        ("src", ">u2"),
        ("tclass", "u1"),
        ("dtype", "u1"),
        ("bound", "u1"),
        ("path", "u1"),
    ]
)
assert HEADER_DTYPE.itemsize == DATA_HEADER_LEN
#: the same fields in native byte order, as :func:`parse_batch` returns them
NATIVE_HEADER_DTYPE: Final = HEADER_DTYPE.newbyteorder("=")

_DATA_STRUCT: Final = struct.Struct(">BBHIHHIIIHHBBBB")
assert _DATA_STRUCT.size == DATA_HEADER_LEN


def message_header(
    job: int, step: int, msg: int, msg_elems: int, src: int, dtype: DType, bound: int
) -> bytes:
    """The fields every data header of one message shares, on the wire, with the
    per-packet fields (flags, layer, seq, offset, payload_len, tclass, path) zero.
    Unchecked: the caller's values are already in range."""
    return _DATA_STRUCT.pack(
        (VERSION << 4) | PacketType.DATA, 0, job, step, msg, 0, 0, 0, msg_elems, 0, src, 0,
        int(dtype) << 4, bound, 0,
    )  # fmt: skip


def bound_to_wire(p: float) -> int:
    """Loss bound ``p`` as carried in the header: thousandths, rounded down."""
    if not 0.0 <= p <= MAX_LOSS_BOUND:
        raise UsageError(f"loss bound p={p} outside [0, {MAX_LOSS_BOUND}]")
    return int(p * 1000 + 1e-9)


def bound_from_wire(value: int) -> float:
    return value / 1000.0


def allowed_loss(p: float, msg_elems: int) -> int:
    """Elements a message of ``msg_elems`` may lose under bound ``p``: spec §2.5's
    ``floor(bound * msg_elems / 1000)`` with ``bound = floor(1000 p)``, in integers
    (a float product can land one element off for large messages)."""
    return bound_to_wire(p) * msg_elems // 1000


#: what a receiver verifies tags with: one key, or a lookup of the key of the pair
#: (claimed source rank -> this rank) by the source rank (spec §3), None for a
#: rank that has none (not a rank of the job: nothing from it verifies)
VerifyKey: TypeAlias = bytes | Callable[[int], bytes | None]


def key_of_source(key: VerifyKey, src: int) -> bytes | None:
    """The key that verifies what claims to come from rank ``src`` (None: none does)."""
    return key if isinstance(key, bytes) else key(src)


@dataclass(frozen=True, slots=True)
class DataHeader:
    """One data header as an object; the data path uses :data:`HEADER_DTYPE` instead."""

    job: int
    step: int
    msg: int
    seq: int
    offset: int
    msg_elems: int
    payload_len: int
    layer: int = 0
    src: int = 0
    prio: int = 0
    drop: bool = False
    mag: int = 0
    dtype: DType = DType.FLOAT32
    bound: int = 0
    path: int = 0
    flags: Flags = Flags.NONE

    def __post_init__(self) -> None:
        _check_range("job", self.job, 0xFFFF)
        _check_range("step", self.step, 0xFFFFFFFF)
        _check_range("msg", self.msg, 0xFFFF)
        _check_range("seq", self.seq, 0xFFFFFFFF)
        _check_range("offset", self.offset, 0xFFFFFFFF)
        _check_range("msg_elems", self.msg_elems, 0xFFFFFFFF)
        _check_range("payload_len", self.payload_len, 0xFFFF)
        _check_range("layer", self.layer, 0xFFFF)
        _check_range("src", self.src, 0xFFFF)
        _check_range("prio", self.prio, 7)
        _check_range("mag", self.mag, 15)
        _check_range("bound", self.bound, 255)
        _check_range("path", self.path, 255)
        if int(self.flags) & ~_DATA_FLAG_MASK:
            raise UsageError(f"unknown data flags {int(self.flags):#x}")

    @property
    def tclass(self) -> int:
        return pack_tclass(self.prio, self.drop, self.mag)

    def pack(self) -> bytes:
        return _DATA_STRUCT.pack(
            (VERSION << 4) | PacketType.DATA,
            int(self.flags),
            self.job,
            self.step,
            self.msg,
            self.layer,
            self.seq,
            self.offset,
            self.msg_elems,
            self.payload_len,
            self.src,
            self.tclass,
            int(self.dtype) << 4,
            self.bound,
            self.path,
        )


def _check_range(name: str, value: int, maximum: int) -> None:
    if not 0 <= value <= maximum:
        raise UsageError(f"{name}={value} does not fit its field (0..{maximum})")


def check_message_key(step: int, msg: int) -> None:
    """Refuse a message key the headers cannot carry (``step`` 32 bits, ``msg``
    16), naming the field: before a transfer starts, not when its first packet
    or control message is built."""
    if type(step) is int and type(msg) is int and 0 <= step <= 0xFFFFFFFF and 0 <= msg <= 0xFFFF:
        return  # (the usual key, checked without a call: twice per send and receive)
    for name, value, maximum in (("step", step, 0xFFFFFFFF), ("msg", msg, 0xFFFF)):
        if not isinstance(value, int | np.integer) or isinstance(value, bool):
            raise UsageError(f"{name}={value!r} must be an integer")
        _check_range(name, int(value), maximum)


def pack_tclass(prio: int, drop: bool, mag: int) -> int:
    """Traffic-class byte: priority (bits 7-5), drop-eligible (bit 4), magnitude (3-0)."""
    return (prio << 5) | (int(drop) << 4) | mag


def encode_data(
    header: DataHeader,
    payload: bytes | memoryview,
    key: bytes | None = None,
    *,
    nonce: int | None = None,
) -> bytes:
    """One data datagram; with ``key`` the AUTH flag is set and the trailer (the
    8-byte ``nonce`` and the AES-GMAC tag, spec §3) appended. A nonce must never
    tag two datagrams under one key: draw it from the sender's
    :class:`NonceCounter` of :attr:`Domain.DATA`."""
    if len(payload) != header.payload_len:
        raise UsageError(
            f"payload is {len(payload)} bytes but header says payload_len={header.payload_len}"
        )
    flags = header.flags | Flags.AUTH if key is not None else header.flags & ~Flags.AUTH
    body = _replace_flags(header, flags).pack() + bytes(payload)
    if key is None:
        return body
    return seal_datagram(body, key, domain=Domain.DATA, src=header.src, nonce=nonce)


def seal_datagram(body: bytes, key: bytes, *, domain: Domain, src: int, nonce: int | None) -> bytes:
    """``body`` (a datagram up to its payload or control body, AUTH set) with its
    trailer: ``nonce`` (8 bytes, big-endian) and the tag over both."""
    if nonce is None or not 0 <= nonce < 1 << 64:
        raise ValueError(
            f"an authenticated datagram needs a 64-bit nonce (from the sender's "
            f"NonceCounter), got {nonce!r}"
        )
    covered = body + nonce.to_bytes(AUTH_NONCE_LEN, "big")
    return covered + gmac_tag(key, covered, domain=domain, src=src, nonce=nonce)


def tag_matches(data: bytes, key: bytes, *, domain: Domain, src: int) -> bool:
    """Whether ``data`` (a whole datagram with its trailer) carries the right tag
    under ``key``, compared in constant time."""
    end = len(data) - AUTH_TAG_LEN
    nonce = int.from_bytes(data[end - AUTH_NONCE_LEN : end], "big")
    want = gmac_tag(key, data[:end], domain=domain, src=src, nonce=nonce)
    return hmac.compare_digest(want, data[end:])


def _replace_flags(header: DataHeader, flags: Flags) -> DataHeader:
    return replace(header, flags=Flags(int(flags)))


def peek_type(data: bytes | memoryview) -> PacketType:
    """The packet type of a datagram, checking only version and type."""
    if len(data) < 1:
        raise WireError(Reason.TRUNCATED, "truncated datagram: 0 bytes")
    vt = data[0]
    if vt >> 4 != VERSION:
        raise WireError(
            Reason.BAD_VERSION, f"unknown version {vt >> 4} (this is version {VERSION})"
        )
    try:
        return PacketType(vt & 0x0F)
    except ValueError:
        raise WireError(Reason.BAD_TYPE, f"unknown packet type {vt & 0x0F}") from None


# --------------------------------------------------------------------------- TOS


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class TosMap:
    """Priority class -> DSCP and drop eligibility -> ECN codepoint.

    Defaults: class ``c`` -> DSCP ``8 * c`` (CS0..CS7); protected packets are
    ECN-capable (ECT(0), ``0b10``) and drop-eligible ones Not-ECT (``0b00``),
    because commodity WRED with ECN marks ECN-capable packets and drops the rest.
    """

    dscp: Sequence[int] = (0, 8, 16, 24, 32, 40, 48, 56)
    ecn_protected: int = 0b10
    ecn_droppable: int = 0b00

    def __post_init__(self) -> None:
        if len(self.dscp) != 8:
            raise UsageError(
                f"TosMap.dscp needs one DSCP per priority class (8), got {len(self.dscp)}"
            )
        for c, d in enumerate(self.dscp):
            if not _is_int(d) or not 0 <= d <= 63:
                raise UsageError(f"TosMap.dscp[{c}]={d!r} is not a DSCP (an integer 0..63)")
        for name in ("ecn_protected", "ecn_droppable"):
            if not _is_int(getattr(self, name)) or not 0 <= getattr(self, name) <= 3:
                raise UsageError(
                    f"TosMap.{name}={getattr(self, name)!r} is not an ECN codepoint "
                    "(an integer 0..3)"
                )

    def tos(self, prio: int, drop: bool) -> int:
        """The IPv4 TOS / IPv6 traffic-class byte for a packet class."""
        if not 0 <= prio <= 7:
            raise UsageError(f"priority class {prio} outside 0..7")
        return (self.dscp[prio] << 2) | (self.ecn_droppable if drop else self.ecn_protected)
