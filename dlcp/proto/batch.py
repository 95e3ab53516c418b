"""Batches of data datagrams, parsed and validated in place (the data path).

A batch is what one UDP GRO read (or a run of them) hands over: datagrams of one
segment size back to back, the last possibly shorter. :func:`parse_batch` views
it as fixed-stride records, unpacks the headers in one pass, and gives every
record a :class:`~dlcp.proto.wire.Reason`; it never raises for bad content. The
header layout and the rules are those of :mod:`dlcp.proto.wire`.
:func:`decode_data` is the single-datagram view: one record, parsed the same way,
as a :class:`~dlcp.proto.wire.DataHeader` and its payload, or a :class:`WireError`.

The receive fast paths read only a batch's first header, with plain integers:
:func:`run_head` (which message a run belongs to) and :func:`open_head` (the
first datagram of a new message, if :func:`parse_batch` would take it as it is).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, NamedTuple, TypeAlias

import numpy as np
import numpy.typing as npt

from .auth import verify_records
from .kernels import unpack_uniform
from .wire import (
    _DATA_FLAG_MASK,
    _ITEMSIZE_BY_CODE,
    AUTH_TRAILER_LEN,
    DATA_HEADER_LEN,
    HEADER_DTYPE,
    VERSION,
    DataHeader,
    DType,
    Flags,
    PacketType,
    Reason,
    VerifyKey,
    WireError,
    key_of_source,
)

__all__ = [
    "PER_PACKET_FLAGS",
    "SHARED_HEADER_MASK",
    "OpenHead",
    "ParsedBatch",
    "RunHead",
    "decode_data",
    "open_head",
    "parse_batch",
    "run_head",
]

_DATA_VT: Final = (VERSION << 4) | PacketType.DATA
_AUTH: Final = int(Flags.AUTH)
_ITEMSIZE_OF_CODE: Final = tuple(_ITEMSIZE_BY_CODE.tolist())  # by wire code
#: the flags a data datagram may carry without a tag (AUTH takes the general path)
PER_PACKET_FLAGS: Final = int(Flags.LAST | Flags.RETRANSMIT)
#: the fields of a data header a run is checked against: ver_type, flags, job, step,
#: msg, msg_elems, src, dtype
_RUN_HEAD: Final = struct.Struct(">BBHIH2x4x4xI2xHxB")
#: every field of a data header but layer and path (the first datagram of a message)
_OPEN_HEAD: Final = struct.Struct(">BBHIH2xIIIHHBBBx")
_DTYPES: Final = tuple(DType)  # by wire code

UInt8Array: TypeAlias = npt.NDArray[np.uint8]


class RunHead(NamedTuple):
    """The first header of a batch, as far as a run of one message needs it."""

    key: tuple[int, int, int]  # (src, step, msg)
    flags: int
    msg_elems: int
    dtype_byte: int


def run_head(buf: UInt8Array, job: int) -> RunHead | None:
    """The first datagram's message and run fields, if it is a data datagram of
    ``job`` (None: shorter than a header, another packet type or another job)."""
    if len(buf) < DATA_HEADER_LEN:
        return None
    vt, flags, their_job, step, msg, elems, src, dtype = _RUN_HEAD.unpack_from(buf.data)
    if vt != _DATA_VT or their_job != job:
        return None
    return RunHead((src, step, msg), flags, elems, dtype)


class OpenHead(NamedTuple):
    """The first datagram of a message, accepted as :func:`parse_batch` would."""

    key: tuple[int, int, int]  # (src, step, msg)
    flags: int
    seq: int
    offset: int
    msg_elems: int
    payload_len: int
    tclass: int
    code: int  # the dtype byte
    bound: int  # in thousandths, as on the wire
    dtype: DType


def open_head(buf: UInt8Array, segment_size: int, job: int) -> OpenHead | None:
    """The first datagram's fields, if :func:`parse_batch` would accept it as it
    is: a data datagram of ``job`` with no flag but LAST and RETRANSMIT (a tag
    needs the general path), a known dtype, a payload of whole elements that is
    the datagram's (``segment_size`` at most) and lies inside the message. None
    otherwise: the general path then gives it its exact reason."""
    if len(buf) < DATA_HEADER_LEN:
        return None
    vt, flags, their_job, step, msg, seq, offset, elems, payload_len, src, tclass, code, bound = (
        _OPEN_HEAD.unpack_from(buf.data)
    )
    if (
        vt != _DATA_VT
        or their_job != job
        or flags & ~PER_PACKET_FLAGS
        or code & 0x0F
        or code >= len(_DTYPES) << 4
        or payload_len == 0
        or min(len(buf), segment_size) != DATA_HEADER_LEN + payload_len
        or elems == 0
    ):
        return None
    dtype = _DTYPES[code >> 4]
    if payload_len % dtype.itemsize or offset + payload_len // dtype.itemsize > elems:
        return None
    return OpenHead(
        (src, step, msg), flags, seq, offset, elems, payload_len, tclass, code, bound, dtype
    )


@dataclass(frozen=True, slots=True)
class ParsedBatch:
    """A batch of data records, parsed in place.

    ``headers`` is a structured view (no copy) of the records' headers,
    ``payloads`` a ``(n, segment_size - 32)`` byte view, ``lengths`` the datagram
    length of each record and ``reasons`` a :class:`Reason` code per record.
    """

    headers: npt.NDArray[np.void]
    payloads: UInt8Array
    lengths: npt.NDArray[np.int64]
    reasons: UInt8Array
    job: int

    @property
    def ok(self) -> npt.NDArray[np.bool_]:
        return np.equal(self.reasons, 0)

    def message(self, i: int) -> str:
        """The exact error message for record ``i`` (empty when it was accepted)."""
        return _reason_message(self, i)


def parse_batch(
    buf: UInt8Array,
    segment_size: int,
    *,
    job: int,
    key: VerifyKey | None = None,
    require_auth: bool = False,
    n_records: int | None = None,
) -> ParsedBatch:
    """Parse ``buf`` as consecutive datagrams of ``segment_size`` bytes (the last
    one may be shorter), the way UDP GRO hands them over. Never raises for bad
    content: each record gets a :class:`Reason`.

    ``key`` verifies the tags: one key, or the key of each record's claimed
    source rank (``src -> key``: the key of the pair src -> this rank, spec §3).
    """
    if segment_size <= 0:
        raise ValueError(f"segment_size must be positive, got {segment_size}")
    total = len(buf)
    n = n_records if n_records is not None else max(1, -(-total // segment_size))
    stride = max(segment_size, DATA_HEADER_LEN)
    padded_len = n * stride
    if total >= padded_len and segment_size >= DATA_HEADER_LEN:
        records = buf[:padded_len].reshape(n, stride)
    else:
        # short tail or tiny datagrams: copy into a zero-padded array
        records = np.zeros((n, stride), dtype=np.uint8)
        flat = records.reshape(-1)
        if segment_size >= DATA_HEADER_LEN:
            flat[:total] = buf[:padded_len]
        else:
            for i in range(n):
                chunk = buf[i * segment_size : (i + 1) * segment_size]
                records[i, : len(chunk)] = chunk
    last_len = total - (n - 1) * segment_size
    lengths = np.empty(n, dtype=np.int64)
    lengths[:-1] = segment_size
    lengths[-1] = last_len
    payloads = records[:, DATA_HEADER_LEN:]
    # one gather of the headers into a compact, native-endian array: every later
    # field access is then a cheap contiguous read, not a strided byte swap
    headers, shared = unpack_uniform(records, HEADER_DTYPE, SHARED_HEADER_MASK)
    if shared and _uniform_and_valid(
        headers, segment_size, last_len, job=job, auth=key is not None or require_auth
    ):
        reasons = np.zeros(n, dtype=np.uint8)
    else:
        reasons = _validate(headers, lengths, job=job, key=key, require_auth=require_auth)
    if key is not None:
        _check_tags(records, headers, lengths, reasons, key)
    return ParsedBatch(headers, payloads, lengths, reasons, job)


# Bytes of the data header that every packet of one message shares: version/type,
# the reserved flag bits and AUTH (a sender tags all its packets or none), job,
# step, msg, msg_elems, src, dtype, bound. Every multi-byte field is masked whole
# or not at all, so the mask reads the same on wire-order and native-order headers.
SHARED_HEADER_MASK: Final = (
    bytes([0xFF, 0xFC, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF])  # ver_type flags job step
    + bytes([0xFF, 0xFF, 0, 0, 0, 0, 0, 0])  # msg layer seq
    + bytes([0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF])  # offset msg_elems
    + bytes([0, 0, 0xFF, 0xFF, 0, 0xFF, 0xFF, 0])  # payload_len src tclass dtype bound path
)


def _uniform_and_valid(
    h: npt.NDArray[np.void],
    segment_size: int,
    last_len: int,
    *,
    job: int,
    auth: bool,
) -> bool:
    """Fast path for the usual batch: packets of one message, all valid.

    For records that share the message-wide bytes of record 0 (the caller checked
    that with :data:`SHARED_HEADER_MASK` while unpacking them), each ``segment_size``
    bytes long but the last (``last_len``), checks that record 0 passes every rule
    and that the per-packet fields (lengths, offsets) are right: with plain
    integers, and one or two vectorised operations over the records but the last.
    False means "look closer": :func:`_validate` then gives each record its exact
    reason.
    """
    n = len(h)
    vt, flags, pkt_job, _, _, _, _, offset, msg_elems, payload_len, _, _, code, _, _ = h[
        n - 1
    ].item()  # the last record: the message-wide fields are those of record 0
    itemsize = _ITEMSIZE_OF_CODE[code >> 4]
    if (
        (last_len if n == 1 else min(segment_size, last_len)) < DATA_HEADER_LEN
        or vt != _DATA_VT
        or pkt_job != job
        or flags & ~_DATA_FLAG_MASK
        or code & 0x0F
        or itemsize == 0
        or msg_elems == 0
    ):
        return False
    tagged = bool(flags & _AUTH)  # the same in every record (shared mask)
    if auth and not tagged:
        return False
    overhead = DATA_HEADER_LEN + (AUTH_TRAILER_LEN if tagged else 0)
    # every payload length must be its datagram's length less the overhead; then
    # the per-record rules on it hold if they hold for the two lengths there are
    last_payload = last_len - overhead
    if (
        payload_len != last_payload
        or last_payload <= 0
        or last_payload % itemsize
        or offset + last_payload // itemsize > msg_elems
    ):
        return False
    if n == 1:
        return True
    payload = segment_size - overhead
    if payload <= 0 or payload % itemsize or payload > 0xFFFF:
        return False
    rest = h[: n - 1]
    return bool(
        (rest["payload_len"] == payload).all()
        and int(rest["offset"].max()) + payload // itemsize <= msg_elems
    )


def _validate(
    h: npt.NDArray[np.void],
    lengths: npt.NDArray[np.int64],
    *,
    job: int,
    key: VerifyKey | None,
    require_auth: bool,
) -> UInt8Array:
    """Vectorised header checks; the first failing rule wins (same order as the spec)."""
    n = len(h)
    vt = h["ver_type"]
    flags = h["flags"].astype(np.int64)
    dtype_code = h["dtype"].astype(np.int64)
    itemsize = _ITEMSIZE_BY_CODE[(dtype_code >> 4) & 0x0F]
    safe_item = np.maximum(itemsize, 1)
    has_tag = (flags & Flags.AUTH) != 0
    payload_len = h["payload_len"].astype(np.int64)
    expected = DATA_HEADER_LEN + payload_len + AUTH_TRAILER_LEN * has_tag
    offset = h["offset"].astype(np.int64)
    elems = h["msg_elems"].astype(np.int64)
    payload_elems = payload_len // safe_item
    rules: list[tuple[Reason, npt.NDArray[np.bool_]]] = [
        (Reason.TRUNCATED, lengths < DATA_HEADER_LEN),
        (Reason.BAD_VERSION, (vt >> 4) != VERSION),
        (Reason.BAD_TYPE, (vt & 0x0F) != PacketType.DATA),
        (Reason.WRONG_JOB, h["job"] != job),
        (
            Reason.BAD_FIELD,
            ((flags & ~_DATA_FLAG_MASK) != 0) | ((dtype_code & 0x0F) != 0) | (itemsize == 0),
        ),
        (
            Reason.LENGTH_MISMATCH,
            (expected != lengths) | (payload_elems * safe_item != payload_len),
        ),
        (
            Reason.OUT_OF_BOUNDS,
            (elems == 0) | (offset + payload_elems > elems) | (payload_len == 0),
        ),
    ]
    if key is not None or require_auth:
        rules.append((Reason.AUTH_REQUIRED, ~has_tag))
    reasons = np.zeros(n, dtype=np.uint8)
    bad = np.logical_or.reduce([cond for _, cond in rules])
    if not bad.any():
        return reasons
    for reason, cond in reversed(rules):  # the earliest rule is written last and wins
        reasons[cond] = reason
    return reasons


def _check_tags(
    records: UInt8Array,
    h: npt.NDArray[np.void],
    lengths: npt.NDArray[np.int64],
    reasons: UInt8Array,
    key: VerifyKey,
) -> None:
    """AUTH_FAILED for each record that passed every other rule and whose tag is
    wrong: one batch call (:func:`~dlcp.proto.auth.verify_records`) per source
    rank the records claim, one in the usual batch."""
    rows = np.flatnonzero(reasons == 0)
    if not len(rows):
        return
    srcs = h["src"][rows]
    groups = [rows] if bool((srcs == srcs[0]).all()) else [rows[srcs == s] for s in np.unique(srcs)]
    for group in groups:
        k = key_of_source(key, int(h["src"][group[0]]))
        if k is None:  # a rank with no key (not of this job): nothing verifies
            reasons[group] = Reason.AUTH_FAILED
            continue
        ok = verify_records(records, lengths, group, k)
        reasons[group[~ok]] = Reason.AUTH_FAILED


def _reason_message(batch: ParsedBatch, i: int) -> str:
    reason = Reason(int(batch.reasons[i]))
    h = batch.headers[i]
    length = int(batch.lengths[i])
    if reason is Reason.OK:
        return ""
    if reason is Reason.TRUNCATED:
        return f"truncated datagram: {length} bytes, a data header needs {DATA_HEADER_LEN}"
    vt = int(h["ver_type"])
    if reason is Reason.BAD_VERSION:
        return f"unknown version {vt >> 4} (this is version {VERSION})"
    if reason is Reason.BAD_TYPE:
        return f"unknown packet type {vt & 0x0F} where a data packet was expected"
    if reason is Reason.WRONG_JOB:
        return (
            f"wrong job: datagram is for job {int(h['job'])}, this endpoint serves job {batch.job}"
        )
    if reason is Reason.BAD_FIELD:
        flags, code = int(h["flags"]), int(h["dtype"])
        if flags & ~_DATA_FLAG_MASK:
            return f"reserved flag bits set: flags={flags:#04x}"
        if code & 0x0F:
            return f"reserved bits set in the dtype byte: {code:#04x}"
        return f"unknown element type code {code >> 4}"
    payload_len = int(h["payload_len"])
    if reason is Reason.LENGTH_MISMATCH:
        tag = AUTH_TRAILER_LEN if int(h["flags"]) & Flags.AUTH else 0
        itemsize = int(_ITEMSIZE_BY_CODE[int(h["dtype"]) >> 4])
        if payload_len % itemsize:
            return (
                f"payload length mismatch: payload_len={payload_len} is not a multiple "
                f"of the element size {itemsize}"
            )
        return (
            f"payload length mismatch: header says {payload_len} payload bytes "
            f"({DATA_HEADER_LEN + payload_len + tag} in all), datagram has {length}"
        )
    if reason is Reason.OUT_OF_BOUNDS:
        itemsize = int(_ITEMSIZE_BY_CODE[int(h["dtype"]) >> 4])
        off, elems = int(h["offset"]), int(h["msg_elems"])
        return (
            f"offset/length beyond the message: elements [{off}, {off + payload_len // itemsize}) "
            f"of a {elems}-element message"
        )
    if reason is Reason.AUTH_REQUIRED:
        return "authentication required: datagram carries no tag"
    return "authentication failed: tag does not match"


def decode_data(
    data: bytes | memoryview, *, job: int, key: VerifyKey | None = None
) -> tuple[DataHeader, bytes]:
    """Parse and validate one data datagram; raises :class:`WireError`."""
    buf = np.frombuffer(data, dtype=np.uint8)
    batch = parse_batch(buf, len(buf) if len(buf) else 1, job=job, key=key, n_records=1)
    if batch.reasons[0] != Reason.OK:
        raise WireError(Reason(int(batch.reasons[0])), batch.message(0))
    h = batch.headers[0]
    tclass = int(h["tclass"])
    header = DataHeader(
        job=int(h["job"]),
        step=int(h["step"]),
        msg=int(h["msg"]),
        seq=int(h["seq"]),
        offset=int(h["offset"]),
        msg_elems=int(h["msg_elems"]),
        payload_len=int(h["payload_len"]),
        layer=int(h["layer"]),
        src=int(h["src"]),
        prio=tclass >> 5,
        drop=bool(tclass & 0x10),
        mag=tclass & 0x0F,
        dtype=DType(int(h["dtype"]) >> 4),
        bound=int(h["bound"]),
        path=int(h["path"]),
        flags=Flags(int(h["flags"])),
    )
    payload = bytes(data[DATA_HEADER_LEN : DATA_HEADER_LEN + header.payload_len])
    return header, payload
