"""A message's first round planned in one pass: send order, the record of each
chunk, and every record's header (and, unless the payload is lent, its chunk), by
the C accelerator's ``plan_round`` where it is built, else by
:meth:`.ChunkTable.send_order` and :func:`.build_records` in numpy, which the
tests hold it to (:func:`first_round`). A send's plan and first round together
(:func:`plan_first_round`, what :class:`.Outbox` calls): for a float32 message the
kernels read as it is, one call of the accelerator's ``plan_send`` samples,
classifies and lays out the round; for any other, :func:`.plan_message` and
:func:`first_round`."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple, cast

import numpy as np
import numpy.typing as npt

from . import kernels
from .classify import Classifier, kernel_rule
from .magnitudes import SAMPLE_BLOCK, float32_sampling
from .packetizer import (
    BoolArray,
    ChunkTable,
    Int64Array,
    MessageId,
    MessageShape,
    RecordRun,
    Segments,
    UInt8Array,
    build_records,
    message_shape,
    plan_shaped,
    record_stride,
    shared_header,
)
from .wire import AUTH_TRAILER_LEN, DATA_HEADER_LEN, HEADER_DTYPE, DType, Flags, message_header

__all__ = ["FirstRound", "first_round", "plan_first_round"]

#: where plan_round writes its per-chunk fields in a data header
_PLAN_LAYOUT = bytes(
    HEADER_DTYPE.fields[name][1]  # type: ignore[index]
    for name in ("flags", "layer", "seq", "offset", "payload_len", "tclass")
)
#: plan_round counts records by send-order key (7 - prio) * 2 + drop: the key of
#: class prio * 2 + drop, for each of the 16 classes, is 14 - class + 2 * drop
_KEY_OF_CLASS = tuple(14 - c + 2 * (c & 1) for c in range(16))


class FirstRound(NamedTuple):
    """A message's first round (:func:`first_round`)."""

    run: RecordRun
    #: the chunk of each record: :meth:`ChunkTable.send_order`
    order: Int64Array
    #: the record of each chunk
    row_of_seq: Int64Array
    #: chunks of each class, at ``prio * 2 + drop`` (16 counts)
    class_chunks: tuple[int, ...]


def first_round(
    source: UInt8Array,
    table: ChunkTable,
    ident: MessageId,
    *,
    authenticate: bool,
    buffer: UInt8Array | None = None,
    lend: bool = False,
    accelerated: bool | None = None,
) -> FirstRound:
    """The records of a message's first round, in :meth:`ChunkTable.send_order`,
    with that order, the record of each chunk and the chunks of each class: what
    :func:`build_records` gives for the whole message, in one pass of the C
    accelerator where it is built. ``lend``: headers only, the payload read
    from ``source`` by whoever sends (``build_records``'s ``payload``)."""
    use_c = kernels.ACCELERATED if accelerated is None else accelerated
    payload = source if lend else None
    if not use_c:
        order = table.send_order()
        row_of_seq = np.empty(table.n_chunks, dtype=np.int64)
        row_of_seq[order] = np.arange(table.n_chunks)
        run = build_records(
            source, table, order, ident, authenticate=authenticate, buffer=buffer,
            row_of_seq=row_of_seq, payload=payload,
        )  # fmt: skip
        return FirstRound(run, order, row_of_seq, table.class_chunks())
    tag = AUTH_TRAILER_LEN if authenticate else 0
    stride = record_stride(table, authenticate=authenticate)
    n = table.n_chunks
    shape = (n, DATA_HEADER_LEN + tag if lend else stride)
    fits = buffer is not None and buffer.shape == shape and buffer.dtype == np.uint8
    records = buffer if fits and buffer is not None else np.empty(shape, np.uint8)
    order, row_of_seq, prio, drop, counts = kernels.plan_round(
        records, shared_header(ident, table), _PLAN_LAYOUT,
        table.prio, table.drop, table.mag, table.layer, table.chunk_elems, table.msg_elems,
        table.dtype.itemsize, int(Flags.AUTH) if authenticate else 0, int(Flags.LAST),
        None if lend else source, stream=not lend and kernels.streams(records.nbytes),
    )  # fmt: skip
    return _planned(table, records, stride, tag, payload, order, row_of_seq, prio, drop, counts)


def _planned(
    table: ChunkTable,
    records: UInt8Array,
    stride: int,
    tag: int,
    payload: UInt8Array | None,
    order: Int64Array,
    row_of_seq: Int64Array,
    prio: UInt8Array,
    drop: BoolArray,
    counts: tuple[int, ...],
) -> FirstRound:
    """The first round of records the C accelerator laid out (``plan_round``'s
    outputs and counts)."""
    n = table.n_chunks
    last_row = int(row_of_seq[-1])
    tail_bytes = (table.msg_elems - (n - 1) * table.chunk_elems) * table.dtype.itemsize
    lengths = np.full(n, stride, dtype=np.int64)
    lengths[last_row] = DATA_HEADER_LEN + tail_bytes + tag
    ends = set(itertools.accumulate(counts))
    ends.discard(0)
    ends.discard(n)
    run = RecordRun(
        records, lengths, order, prio, drop, stride,
        short=last_row if tail_bytes != stride - DATA_HEADER_LEN - tag else -1,
        payload=payload, class_ends=sorted(ends),
    )  # fmt: skip
    return FirstRound(run, order, row_of_seq, tuple(map(counts.__getitem__, _KEY_OF_CLASS)))


def plan_first_round(
    data: npt.NDArray[np.generic],
    dtype: DType,
    ident: MessageId,
    *,
    chunk_bytes: int,
    classifier: Classifier,
    segments: Segments | None = None,
    magnitude_sample: int = 16,
    loss_bound: float | None = None,
    authenticate: bool,
    lend: bool = False,
    take: Callable[[tuple[int, int]], UInt8Array | None] | None = None,
) -> tuple[ChunkTable, FirstRound]:
    """:func:`.plan_message` of ``data`` (1-D, C-contiguous) and the
    :func:`first_round` of the table, the records in a buffer from ``take``
    (given their shape; None: a new one). A float32 message that the C kernels
    sample as it is, classified by a built-in classifier, is planned and laid
    out in one call of the accelerator (``plan_send``), without the Python
    between the two; every other the two functions plan. Both give the same
    table and round (tests/proto/test_packetizer.py)."""
    shape = message_shape(data, dtype, chunk_bytes, segments=segments, loss_bound=loss_bound)
    if dtype is DType.FLOAT32:
        fused = _plan_send(
            data, shape, ident, classifier, magnitude_sample, authenticate, lend, take
        )
        if fused is not None:
            return fused
    table = plan_shaped(data, dtype, shape, classifier, magnitude_sample)
    tag = AUTH_TRAILER_LEN if authenticate else 0
    shape_of = (
        table.n_chunks,
        DATA_HEADER_LEN + tag if lend else record_stride(table, authenticate=authenticate),
    )
    return table, first_round(
        data.reshape(-1).view(np.uint8), table, ident, authenticate=authenticate,
        buffer=take(shape_of) if take is not None else None, lend=lend,
    )  # fmt: skip


def _plan_send(
    data: npt.NDArray[np.generic],
    shape: MessageShape,
    ident: MessageId,
    classifier: Classifier,
    sample: int,
    authenticate: bool,
    lend: bool,
    take: Callable[[tuple[int, int]], UInt8Array | None] | None,
) -> tuple[ChunkTable, FirstRound] | None:
    """:func:`plan_first_round` in one call of ``plan_send``; None where it does
    not apply."""
    sampling = float32_sampling(data, shape.chunk_elems, sample)
    rule = kernel_rule(classifier, shape.n_layers) if sampling is not None else None
    if rule is None or sampling is None or shape.layers.dtype != np.uint16:
        return None
    n, chunk_elems = shape.n_chunks, shape.chunk_elems
    tag = AUTH_TRAILER_LEN if authenticate else 0
    stride = DATA_HEADER_LEN + 4 * chunk_elems + tag
    wanted = (n, DATA_HEADER_LEN + tag if lend else stride)
    records = take(wanted) if take is not None else None
    if records is None or records.shape != wanted or records.dtype != np.uint8:
        records = np.empty(wanted, np.uint8)
    magnitude = np.empty(n, np.float32)
    classes = np.empty(5 * n, np.uint8)
    order = np.empty(2 * n, np.int64)
    counts = kernels.plan_send(
        cast("npt.NDArray[np.float32]", data), chunk_elems, sampling[0], SAMPLE_BLOCK,
        sampling[1], shape.layers, shape.n_layers, rule, shape.may_drop, records,
        message_header(ident.job, ident.step, ident.msg, len(data), ident.src, DType.FLOAT32,
                       ident.bound),
        _PLAN_LAYOUT, int(Flags.AUTH) if authenticate else 0, int(Flags.LAST), lend=lend,
        stream=not lend and kernels.streams(records.nbytes), magnitude=magnitude,
        classes=classes, order=order,
    )  # fmt: skip
    if counts is None:  # (a layer out of range: plan_message says so)
        return None
    table = ChunkTable(
        DType.FLOAT32, len(data), chunk_elems, shape.layers, classes[:n],
        classes[n : 2 * n].view(np.bool_), classes[2 * n : 3 * n], magnitude,
    )  # fmt: skip
    first = _planned(
        table, records, stride, tag, cast("UInt8Array", data.view(np.uint8)) if lend else None,
        order[:n], order[n:], classes[3 * n : 4 * n], classes[4 * n :].view(np.bool_), counts,
    )  # fmt: skip
    return table, first
