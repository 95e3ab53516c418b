"""The compiled code's argument checks hold for numbers whose products overflow 64 bits.

libFuzzer (``tests/fuzz/``, ``make fuzz``) found that ``scatter_run`` and
``swap_records`` in ``dlcp/proto/_kernels.c`` multiplied the caller's geometry
before comparing it with the buffers: ``n * stride``, ``msg_elems * itemsize``,
``msg_elems + chunk_elems - 1`` and ``(n - 1) * stride`` overflowed (undefined
behaviour in C; on x86 the product wrapped), so a call naming 2**59 + 1 records of
a 32-byte buffer passed the checks and read past it, and ``swap_records`` asked
for 2**62 + 1 records of a 4-byte buffer wrote past it. Each case here passed the
old checks; the checks now divide instead of multiplying, and each is refused
with the error that names it. The inputs that found them are in
``tests/fuzz/regressions/``, and ``make fuzz`` runs them first. The native send
engine's ``post()`` (``dlcp/io/_engine.c``) had the same kind of check, found while
writing its fuzz target: the record buffer was compared with ``stride * count``.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

from dlcp.proto import kernels
from dlcp.proto.batch import SHARED_HEADER_MASK
from dlcp.proto.reassembler import _RUN_LAYOUT
from dlcp.proto.wire import DATA_HEADER_LEN

needs_kernels = pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")

HL = DATA_HEADER_LEN


def _scatter(
    *, n: int, stride: int, total: int, chunk_elems: int, msg_elems: int, itemsize: int
) -> object:
    c_module = kernels._accel
    assert c_module is not None
    buf = np.zeros(max(total, HL), np.uint8)
    template = bytes(HL)
    return c_module.scatter_run(
        buf,
        n,
        stride,
        total,
        template,
        SHARED_HEADER_MASK,
        _RUN_LAYOUT,
        np.zeros(64, np.uint8),
        chunk_elems,
        msg_elems,
        itemsize,
        np.ones(4, np.uint8),  # every chunk received: a matching record is a duplicate
        np.zeros(4, np.uint8),
        False,
    )


@needs_kernels
def test_scatter_run_takes_a_plain_run() -> None:
    """The baseline the cases below break: one 32-byte record of a 16-element
    message is a legal call (a header that is no packet of it: nothing taken)."""
    assert _scatter(n=1, stride=HL, total=HL, chunk_elems=16, msg_elems=16, itemsize=4) == (
        0,
        0,
        0,
        0,
        0,
        0,
    )


@needs_kernels
def test_scatter_run_refuses_a_record_count_whose_span_overflows() -> None:
    # (2**59 + 1) * 32 wraps to 32: the old check saw one record's worth of bytes
    with pytest.raises(ValueError, match="the last record ending inside its stride"):
        _scatter(n=2**59 + 1, stride=HL, total=HL, chunk_elems=16, msg_elems=16, itemsize=4)


@needs_kernels
def test_scatter_run_refuses_a_message_whose_byte_size_overflows() -> None:
    # 2**62 elements of 4 bytes wrap to 0 bytes: any out passed the old check
    with pytest.raises(ValueError, match="buffers too small"):
        _scatter(n=1, stride=HL, total=HL, chunk_elems=2**62, msg_elems=2**62, itemsize=4)


@needs_kernels
def test_scatter_run_counts_the_chunks_of_a_huge_chunk_size_without_overflow() -> None:
    # 16 + (2**63 - 1) - 1 overflowed into a negative chunk count, so the one chunk
    # of this message was never taken; it is one chunk, and its packet lands
    c_module = kernels._accel
    assert c_module is not None
    f_flags, f_seq, f_offset, f_len, _, last_bit = _RUN_LAYOUT[:6]
    payload = np.arange(64, dtype=np.uint8)
    record = np.zeros(HL + 64, np.uint8)
    record[f_flags] = last_bit
    record[f_seq : f_seq + 4] = 0
    record[f_offset : f_offset + 4] = 0
    record[f_len : f_len + 2] = [0, 64]
    record[HL:] = payload
    out, received, received_class = (
        np.zeros(64, np.uint8),
        np.zeros(1, np.uint8),
        np.zeros(1, np.uint8),
    )
    result = c_module.scatter_run(
        record,
        1,
        len(record),
        len(record),
        record[:HL].tobytes(),
        SHARED_HEADER_MASK,
        _RUN_LAYOUT,
        out,
        2**63 - 1,
        16,
        4,
        received,
        received_class,
        False,
    )
    assert result == (1, 1, 16, 0, 0, 64)
    assert (out == payload).all() and received[0] == 1


@needs_kernels
def test_swap_records_refuses_a_record_count_whose_span_overflows() -> None:
    c_module = kernels._accel
    assert c_module is not None
    dst, src = np.zeros(4, np.uint8), np.zeros(4, np.uint8)
    # (2**62 + 1 - 1) * 4 + 4 wraps to 4: the old check let 2**62 + 1 records through
    with pytest.raises(IndexError, match="records do not fit"):
        c_module.swap_records(dst, 4, src, 4, 2**62 + 1, 4, bytes([0, 4]))


def test_engine_post_refuses_records_whose_size_overflows() -> None:
    _engine = pytest.importorskip("dlcp.io._engine")
    count = 2**62 + 1  # 4 * count wraps to 4: a 4-byte buffer passed for the records
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        engine = _engine.Engine([tx.fileno()], 64, "dlcp-overflow-test")
        try:
            engine.add_peer(1, "127.0.0.1", 9, _engine.Pacer(unpaced=True))
            with pytest.raises(ValueError, match="records has 4 bytes"):
                engine.post(
                    dst=1,
                    step=0,
                    msg=0,
                    order=1,
                    records=np.zeros(4, np.uint8),
                    stride=4,
                    per_message=1,
                    count=count,
                    short=-1,
                    short_len=4,
                    tos=np.zeros(1, np.uint8),
                    path=np.zeros(1, np.uint8),
                    prio=np.zeros(1, np.uint8),
                    breaks=np.array([count], np.int64),
                )
        finally:
            engine.close()
