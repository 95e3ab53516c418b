"""Tensor -> packets: chunking, per-chunk classes and fixed-stride record batches.

A message (a 1-D float32 / float16 / bfloat16-as-uint16 / uint8 array) is cut
into chunks of ``chunk_elems`` elements; chunk ``i`` covers elements
``[i * chunk_elems, min((i + 1) * chunk_elems, msg_elems))``, so only the last
chunk may be short. Each chunk gets a magnitude statistic (mean ``|g|`` over an
evenly spaced sample of its values) and, from the classifier, a priority class,
a drop-eligibility bit and a magnitude class.

Records are built in *send order*: highest priority first, protected before
drop-eligible within a priority, then by sequence number. Every record is one
datagram laid out at a fixed stride (header | payload | auth tag), so that a run
of records is one contiguous buffer the I/O driver hands to the kernel in one
call (UDP GSO). Everything is vectorised: no Python loop runs per chunk.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import numpy as np
import numpy.typing as npt

from ..errors import UsageError
from . import kernels
from .auth import NonceCounter, seal_records
from .chunk_layers import chunk_layers
from .classify import Classifier, classify_chunks, classify_uint16_f32
from .kernels import gather_records, streams
from .magnitudes import SAMPLE_BLOCK, chunk_magnitudes, float32_sampling
from .wire import (
    AUTH_TRAILER_LEN,
    DATA_HEADER_LEN,
    HEADER_DTYPE,
    NATIVE_HEADER_DTYPE,
    DType,
    Flags,
    allowed_loss,
    message_header,
)

__all__ = [
    "ChunkTable",
    "MessageId",
    "MessageShape",
    "RecordRun",
    "build_records",
    "header_template",
    "message_shape",
    "plan_message",
    "plan_shaped",
    "record_stride",
    "seal",
    "shared_header",
]

Int64Array = npt.NDArray[np.int64]
UInt8Array = npt.NDArray[np.uint8]
BoolArray = npt.NDArray[np.bool_]
Segments = Sequence[tuple[int, int, int]]


@dataclass(frozen=True, slots=True)
class MessageId:
    """Header fields shared by every packet of one message."""

    job: int
    step: int
    msg: int
    src: int
    bound: int  # loss bound in thousandths, as on the wire


@dataclass(frozen=True, slots=True)
class ChunkTable:
    """Per-chunk facts of one message, indexed by sequence number."""

    dtype: DType
    msg_elems: int
    chunk_elems: int
    layer: npt.NDArray[np.uint16]
    prio: UInt8Array
    drop: BoolArray
    mag: UInt8Array
    magnitude: npt.NDArray[np.float32]

    @property
    def n_chunks(self) -> int:
        return len(self.prio)

    def chunk_len(self, seq: Int64Array) -> Int64Array:
        """Elements in each chunk named by ``seq``."""
        start = seq * self.chunk_elems
        return np.minimum(start + self.chunk_elems, self.msg_elems) - start

    def class_chunks(self) -> tuple[int, ...]:
        """Chunks of each class, at ``prio * 2 + drop`` (16 counts)."""
        cls = self.prio.astype(np.int64) * 2 + self.drop
        return tuple(np.bincount(cls, minlength=16).tolist())

    def send_order(self, seqs: Int64Array | None = None) -> Int64Array:
        """``seqs`` (default: all) sorted highest priority first, protected first, by seq."""
        seqs = np.arange(self.n_chunks, dtype=np.int64) if seqs is None else np.sort(seqs)
        # one byte per chunk: (7 - prio) * 2 + drop; a stable sort of bytes keeps seq order
        key = (7 - self.prio[seqs]) * 2 + self.drop[seqs]
        return seqs[np.argsort(key.astype(np.uint8), kind="stable")]


def plan_message(
    data: npt.NDArray[np.generic],
    dtype: DType,
    *,
    chunk_bytes: int,
    classifier: Classifier,
    segments: Segments | None = None,
    magnitude_sample: int = 16,
    loss_bound: float | None = None,
) -> ChunkTable:
    """Cut ``data`` into chunks and classify them.

    ``loss_bound`` (the message's ``p``): when it lets the receiver give up less
    than one chunk's elements, no chunk is drop-eligible, whatever the classifier
    says. A drop-eligible packet is the one a congested switch drops first, and
    here every dropped chunk would have to be sent again: marking it would only
    invite the loss (small messages, and every message with ``p = 0``).
    """
    shape = message_shape(data, dtype, chunk_bytes, segments=segments, loss_bound=loss_bound)
    return plan_shaped(data, dtype, shape, classifier, magnitude_sample)


def plan_shaped(
    data: npt.NDArray[np.generic],
    dtype: DType,
    shape: MessageShape,
    classifier: Classifier,
    magnitude_sample: int,
) -> ChunkTable:
    """:func:`plan_message` of a message that :func:`message_shape` has checked and
    cut into ``shape``."""
    chunk_elems, layers = shape.chunk_elems, shape.layers
    if dtype is DType.FLOAT32:
        planned = _plan_float32(data, shape, classifier, magnitude_sample)
        if planned is not None:
            return planned
    # one errstate for both (entering one costs microseconds): NaN/inf chunks
    # are protected, not errors
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        magnitude = chunk_magnitudes(data, dtype, chunk_elems, magnitude_sample)
        classes = classify_chunks(
            classifier, layers, magnitude, n_layers=shape.n_layers, may_drop=shape.may_drop
        )
    return ChunkTable(
        dtype=dtype,
        msg_elems=len(data),
        chunk_elems=chunk_elems,
        layer=layers.astype(np.uint16, copy=False),
        prio=classes.prio,
        drop=classes.drop,
        mag=classes.mag,
        magnitude=magnitude,
    )


def _plan_float32(
    data: npt.NDArray[np.generic], shape: MessageShape, classifier: Classifier, sample: int
) -> ChunkTable | None:
    """:func:`plan_message` of a float32 message by the C kernels alone, where
    they apply (float32 values as they are, a sample smaller than a chunk, a
    built-in classifier), without the general path's conversions and checks in
    Python: the same table. None elsewhere."""
    sampling = float32_sampling(data, shape.chunk_elems, sample)
    if sampling is None or shape.layers.dtype != np.uint16:
        return None
    starts, tail = sampling
    chunk_elems, n_chunks = shape.chunk_elems, shape.n_chunks
    n_full = len(data) // chunk_elems
    magnitude = np.empty(n_chunks, dtype=np.float32)
    if n_full:
        kernels.abs_means_f32(
            cast("npt.NDArray[np.float32]", data), chunk_elems, n_full, starts, SAMPLE_BLOCK,
            magnitude,
        )  # fmt: skip
    if n_full < n_chunks:  # (the short last chunk: all its values, as the general path)
        magnitude[-1] = tail
    tags = classify_uint16_f32(
        classifier, shape.layers, magnitude, n_layers=shape.n_layers, may_drop=shape.may_drop
    )
    if tags is None:
        return None
    prio, drop, mag = tags
    return ChunkTable(
        dtype=DType.FLOAT32,
        msg_elems=len(data),
        chunk_elems=chunk_elems,
        layer=shape.layers,
        prio=prio,
        drop=drop,
        mag=mag,
        magnitude=magnitude,
    )


class MessageShape(NamedTuple):
    """How a message is cut into chunks (:func:`message_shape`)."""

    chunk_elems: int
    n_chunks: int
    #: each chunk's layer (uint16 where the segments were remembered: then
    #: read-only, shared by every message with those segments)
    layers: npt.NDArray[np.uint16]
    n_layers: int
    #: whether any chunk may be drop-eligible: the loss bound lets the receiver
    #: give up at least a chunk's elements
    may_drop: bool


def message_shape(
    data: npt.NDArray[np.generic],
    dtype: DType,
    chunk_bytes: int,
    *,
    segments: Segments | None,
    loss_bound: float | None,
) -> MessageShape:
    """:func:`plan_message`'s checks of a message (UsageError naming what does not
    fit) and the chunking that follows from them."""
    if data.ndim != 1:
        raise UsageError(f"a message is a 1-D array, got shape {data.shape}")
    if len(data) == 0:
        raise UsageError("a message needs at least one element")
    if len(data) > 0xFFFFFFFF:
        raise UsageError(f"a message holds at most 2**32-1 elements, got {len(data)}")
    chunk_elems = chunk_bytes // dtype.itemsize
    if chunk_elems * dtype.itemsize != chunk_bytes:
        raise UsageError(f"chunk_bytes={chunk_bytes} is not a multiple of {dtype.itemsize}")
    n_chunks = -(-len(data) // chunk_elems)
    if n_chunks > 0xFFFFFFFF:
        raise UsageError(f"message needs {n_chunks} chunks, more than a seq number holds")
    layers, n_layers = _chunk_layers(segments, n_chunks, chunk_elems, len(data))
    may_drop = loss_bound is None or allowed_loss(loss_bound, len(data)) >= chunk_elems
    return MessageShape(chunk_elems, n_chunks, layers, n_layers, may_drop)


#: segments lists up to this long are remembered with their chunk layers
_CACHED_SEGMENTS = 512


def _chunk_layers(
    segments: Segments | None, n_chunks: int, chunk_elems: int, msg_elems: int
) -> tuple[npt.NDArray[np.uint16], int]:
    """:func:`.chunk_layers.chunk_layers`, remembered for short segment lists: training
    sends the same buckets with the same layers every step."""
    if segments is None or len(segments) > _CACHED_SEGMENTS:
        return chunk_layers(segments, n_chunks, chunk_elems, msg_elems)
    try:
        key = tuple((int(o), int(n), int(layer)) for o, n, layer in segments)
    except (TypeError, ValueError):  # not triples of integers: let chunk_layers say why
        return chunk_layers(segments, n_chunks, chunk_elems, msg_elems)
    return _chunk_layers_of(key, n_chunks, chunk_elems, msg_elems)


@functools.lru_cache(maxsize=256)
def _chunk_layers_of(
    segments: tuple[tuple[int, int, int], ...], n_chunks: int, chunk_elems: int, msg_elems: int
) -> tuple[npt.NDArray[np.uint16], int]:
    layers, n_layers = chunk_layers(segments, n_chunks, chunk_elems, msg_elems)
    layers = layers.astype(np.uint16, copy=False)
    layers.flags.writeable = False  # shared by every message with these segments
    return layers, n_layers


class RecordRun:
    """Records of one message and round, in send order, ``stride`` bytes apart.

    ``lengths[i]`` is the datagram length of record ``i``; only the record of
    the message's last chunk is shorter than ``stride``. What the sender asks of a
    run once per batch (where the next batch ends, its bytes, its buffer) is
    worked out here once, so that handing out a batch costs no array operation.
    """

    __slots__ = (
        "_breaks",
        "_flat",
        "_short",
        "drop",
        "headers",
        "lengths",
        "payload",
        "prio",
        "records",
        "seq",
        "stride",
    )

    def __init__(
        self,
        records: UInt8Array,
        lengths: Int64Array,
        seq: Int64Array,
        prio: UInt8Array,
        drop: BoolArray,
        stride: int,
        *,
        short: int | None = None,
        payload: UInt8Array | None = None,
        class_ends: list[int] | None = None,
    ) -> None:
        """``short``: the record shorter than ``stride`` (-1: none), if the
        caller knows it (else it is looked up in ``lengths``). ``payload``: the
        records hold headers only, and record ``i``'s payload is chunk
        ``seq[i]`` of these bytes (the message's own, lent by the caller: see
        :func:`build_records`); ``stride`` is still the datagrams' spacing on the
        wire. ``class_ends``: where each run of records of one class ends, if the
        caller knows (else it is worked out from ``prio`` and ``drop``)."""
        self.records, self.lengths, self.seq = records, lengths, seq
        self.prio, self.drop, self.stride = prio, drop, stride
        #: the message's bytes, where the records are headers only (else None)
        self.payload = payload
        #: structured view (no copy) of the records' headers
        self.headers: npt.NDArray[np.void] = records[:, :DATA_HEADER_LEN].view(HEADER_DTYPE)[:, 0]
        self._flat = memoryview(records.reshape(-1))  # type: ignore[arg-type]
        if short is None:
            (shorter,) = np.nonzero(lengths != stride)
            short = int(shorter[0]) if len(shorter) else -1
        #: the one record shorter than the stride (the message's last chunk), or -1
        self._short = short
        # where a batch must end: a change of class, and just after the short record
        breaks = set(class_ends or ())
        if class_ends is None and len(seq) > 1:
            (change,) = np.nonzero((prio[1:] != prio[:-1]) | (drop[1:] != drop[:-1]))
            breaks.update((change + 1).tolist())
        if self._short >= 0:
            breaks.add(self._short + 1)
        breaks.add(len(seq))
        self._breaks = sorted(breaks)

    def __len__(self) -> int:
        return len(self.seq)

    @property
    def short(self) -> int:
        """The record shorter than ``stride`` (the message's last chunk), or -1."""
        return self._short

    @property
    def breaks(self) -> Int64Array:
        """Where batches must end (see :meth:`batch_end`), ascending."""
        return np.asarray(self._breaks, np.int64)

    def batch_end(self, start: int, limit: int) -> int:
        """End of the batch that starts at ``start``: at most ``limit`` records of one
        class, and a short record only as the last one (what UDP GSO allows)."""
        return min(start + limit, self._breaks[bisect.bisect_right(self._breaks, start)])

    def batch_nbytes(self, start: int, stop: int) -> int:
        """Datagram bytes of records ``[start, stop)``."""
        size = (stop - start) * self.stride
        if start <= self._short < stop:
            size -= self.stride - int(self.lengths[self._short])
        return size

    def view(self, start: int, stop: int) -> memoryview:
        """The datagrams of records ``[start, stop)``, back to back."""
        assert self.payload is None, "a run of headers only is sent by the native engine"
        at = start * self.stride
        return self._flat[at : at + self.batch_nbytes(start, stop)]

    def spray_batches(self, start: int, stop: int, spray: int) -> list[tuple[int, memoryview]]:
        """Records ``[start, stop)`` cut into runs of ``spray`` records: (count,
        contiguous buffer of datagrams) for each."""
        out = []
        for s in range(start, stop, spray):
            e = min(s + spray, stop)
            out.append((e - s, self.view(s, e)))
        return out


def shared_header(ident: MessageId, table: ChunkTable) -> bytes:
    """The header bytes every data packet of the message shares, on the wire (the
    per-packet fields zero)."""
    return message_header(
        ident.job, ident.step, ident.msg, table.msg_elems, ident.src, table.dtype, ident.bound
    )


def header_template(ident: MessageId, table: ChunkTable) -> npt.NDArray[np.void]:
    """:func:`shared_header` as a structured value, in native order."""
    wire = np.frombuffer(shared_header(ident, table), HEADER_DTYPE)
    return wire.astype(NATIVE_HEADER_DTYPE).reshape(())


def build_records(
    source: UInt8Array,
    table: ChunkTable,
    seqs: Int64Array,
    ident: MessageId,
    *,
    authenticate: bool,
    retransmit: bool = False,
    source_rows: Int64Array | None = None,
    source_stride: int = 0,
    buffer: UInt8Array | None = None,
    row_of_seq: Int64Array | None = None,
    payload: UInt8Array | None = None,
) -> RecordRun:
    """Records for chunks ``seqs`` (already in send order).

    ``source`` is either the message's bytes (``source_rows`` None) or the
    records of an earlier round, whose row for each seq ``source_rows`` names.
    ``buffer`` (optional) is a ``(len(seqs), stride)`` uint8 array to build in,
    so that a sender reuses memory across steps instead of faulting in new pages.
    ``row_of_seq`` (optional, when ``seqs`` is the whole message): the record each
    chunk goes to, if the caller has it already.

    ``payload`` (the message's bytes) makes a run of headers only: its records
    are ``DATA_HEADER_LEN`` bytes apart (authenticated, a header and room for
    the trailer after it, ``DATA_HEADER_LEN + AUTH_TRAILER_LEN`` apart) and no
    payload is copied; whoever sends the run reads each datagram's payload from
    ``payload`` (the native engine gathers header, payload and trailer in one
    ``sendmmsg``, and seals each datagram where its pieces lie).
    """
    itemsize = table.dtype.itemsize
    chunk_bytes = table.chunk_elems * itemsize
    tag = AUTH_TRAILER_LEN if authenticate else 0
    stride = DATA_HEADER_LEN + chunk_bytes + tag
    row_bytes = DATA_HEADER_LEN + tag if payload is not None else stride
    n = len(seqs)
    if buffer is not None and buffer.shape == (n, row_bytes) and buffer.dtype == np.uint8:
        records = buffer
    else:
        records = np.empty((n, row_bytes), dtype=np.uint8)
    last_seq = table.n_chunks - 1
    # the record of the message's last chunk, if among seqs (-1 if not): the only one
    # flagged LAST, and the only one that can be short
    (where_last,) = np.nonzero(seqs == last_seq)
    last_row = int(where_last[0]) if len(where_last) else -1
    tail_bytes = (table.msg_elems - last_seq * table.chunk_elems) * itemsize
    short_row = last_row if tail_bytes != chunk_bytes else -1
    payload_len = np.full(n, chunk_bytes, dtype=np.int64)
    flags = np.full(
        n,
        (int(Flags.RETRANSMIT) if retransmit else 0) | (int(Flags.AUTH) if authenticate else 0),
        dtype=np.uint8,
    )
    if last_row >= 0:
        payload_len[last_row] = tail_bytes
        flags[last_row] |= int(Flags.LAST)
    prio = table.prio[seqs]
    drop = table.drop[seqs]
    if source_rows is not None:
        rows = source_rows[seqs]
        src2d = source.reshape(-1, source_stride)
        copied = DATA_HEADER_LEN + (chunk_bytes if payload is None else 0)
        records[:, :copied] = src2d[rows, :copied]
        records[:, :DATA_HEADER_LEN].view(HEADER_DTYPE)[:, 0]["flags"] = flags
    else:
        template = header_template(ident, table)
        per_record: dict[str, npt.NDArray[np.integer]] = {  # indexed by record (send order)
            "flags": flags,
            "layer": table.layer[seqs],
            "seq": seqs,
            "offset": seqs * table.chunk_elems,
            "payload_len": payload_len,
            "tclass": (prio << 5) | (drop.astype(np.uint8) << 4) | table.mag[seqs],
        }
        _gather(
            source, records, seqs, short_row, chunk_bytes, table.n_chunks, template, per_record,
            row_of_seq, with_payload=payload is None,
        )  # fmt: skip
    if short_row >= 0 and payload is None:
        records[short_row, DATA_HEADER_LEN + tail_bytes :] = 0
    lengths = DATA_HEADER_LEN + payload_len + tag
    return RecordRun(records, lengths, seqs, prio, drop, stride, short=short_row, payload=payload)


def _gather(
    source: UInt8Array,
    records: UInt8Array,
    seqs: Int64Array,
    short_row: int,
    chunk_bytes: int,
    n_chunks: int,
    template: npt.NDArray[np.void],
    per_record: dict[str, npt.NDArray[np.integer]],
    row_of_seq: Int64Array | None,
    *,
    with_payload: bool = True,
) -> None:
    """Record ``i``: its header and chunk ``seqs[i]`` of ``source`` (see
    :func:`.kernels.gather_records`), the short last chunk of a message (record
    ``short_row``, -1 if none) apart. Without payload, the header alone.

    The source is read in ascending chunk order and the records written wherever
    the send order puts them: sequential reads stream from memory, and scattered
    whole-row writes cost no more than sequential ones, whereas the other way round
    every row read would be a cache and TLB miss.

    Without payload nothing of ``source`` is read and no record is cut short, so
    every header, the short last chunk's too, is written in one call in record
    order, with no map from chunks to records."""
    n = len(seqs)
    if not with_payload:
        gather_records(
            records, HEADER_DTYPE, template, per_record, None, source, chunk_bytes, None, n, 0
        )
        return
    in_order: Int64Array | None = None
    if n == n_chunks:  # a whole message: seqs is a permutation of 0..n-1
        if row_of_seq is None:
            row_of_seq = np.empty(n, dtype=np.int64)
            row_of_seq[seqs] = np.arange(n, dtype=np.int64)
    else:
        row_of_seq = np.argsort(seqs, kind="stable")
        in_order = seqs[row_of_seq]
    n_copy = n
    if short_row >= 0:  # the message's last chunk is short: last in seq order
        n_copy -= 1
        seq = int(seqs[short_row])
        gather_records(
            records,
            HEADER_DTYPE,
            template,
            per_record,
            np.array([short_row], np.int64),
            source,
            chunk_bytes,
            np.array([seq], np.int64),
            1,
            len(source) - seq * chunk_bytes if with_payload else 0,
        )
    if n_copy:
        gather_records(
            records,
            HEADER_DTYPE,
            template,
            per_record,
            row_of_seq,
            source,
            chunk_bytes,
            in_order,
            n_copy,
            chunk_bytes if with_payload else 0,
            stream=streams(records.nbytes),
        )


def record_stride(table: ChunkTable, *, authenticate: bool) -> int:
    """Bytes from one record to the next for this message."""
    tag = AUTH_TRAILER_LEN if authenticate else 0
    return DATA_HEADER_LEN + table.chunk_elems * table.dtype.itemsize + tag


def seal(
    run: RecordRun,
    start: int,
    stop: int,
    *,
    path: int | UInt8Array,
    key: bytes | None,
    nonces: NonceCounter | None = None,
) -> None:
    """Stamp the path id (one for all, or one per record) on records ``[start, stop)``
    and, with ``key``, their nonces (fresh ones from ``nonces``, drawn now: a
    record sent again is sealed again) and tags, in one batch call."""
    run.headers[start:stop]["path"] = path
    if key is None:
        return
    if nonces is None:
        raise ValueError("seal: a key needs the sender's nonce counter (nonces=)")
    seal_records(run.records, run.lengths, start, stop, key, nonces)
