"""A message's first round planned in one pass: send order, the record of each
chunk, and every record's header (and, unless the payload is lent, its chunk), by
the C accelerator's ``plan_round`` where it is built, else by
:meth:`.ChunkTable.send_order` and :func:`.build_records` in numpy, which the
tests hold it to."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np

from . import kernels
from .packetizer import (
    ChunkTable,
    Int64Array,
    MessageId,
    RecordRun,
    UInt8Array,
    build_records,
    record_stride,
    shared_header,
)
from .wire import AUTH_TRAILER_LEN, DATA_HEADER_LEN, HEADER_DTYPE, Flags

__all__ = ["FirstRound", "first_round"]

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
    chunk_bytes = table.chunk_elems * table.dtype.itemsize
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
    last_row = int(row_of_seq[-1])
    tail_bytes = (table.msg_elems - (n - 1) * table.chunk_elems) * table.dtype.itemsize
    lengths = np.full(n, stride, dtype=np.int64)
    lengths[last_row] = DATA_HEADER_LEN + tail_bytes + tag
    ends = set(itertools.accumulate(counts))
    ends.discard(0)
    ends.discard(n)
    run = RecordRun(
        records, lengths, order, prio, drop, stride,
        short=last_row if tail_bytes != chunk_bytes else -1, payload=payload,
        class_ends=sorted(ends),
    )  # fmt: skip
    return FirstRound(run, order, row_of_seq, tuple(map(counts.__getitem__, _KEY_OF_CLASS)))
