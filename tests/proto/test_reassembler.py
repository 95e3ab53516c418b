"""Regression: a batch that holds a contiguous range of chunks out of order.

Senders send protected chunks before drop-eligible ones, so one GRO batch can
hold, say, chunks 0..4 in the order 0, 3, 1, 2, 4. Its first and last seq are
``len - 1`` apart, which once sent it down the in-order straight-copy path and
wrote chunk 3's payload into chunk 1's place (found by the endpoint integration
tests as silent corruption of lossless transfers).
"""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.proto.batch import parse_batch
from dlcp.proto.config import FillPolicy
from dlcp.proto.reassembler import Reassembler
from dlcp.proto.wire import DataHeader, DType, Flags, encode_data

JOB = 5
CHUNK = 4  # elements per chunk
N_CHUNKS = 6


@pytest.mark.parametrize("order", [[0, 3, 1, 2, 4], [1, 2, 4, 3], [2, 1], [0, 1, 2, 3, 4]])
def test_out_of_order_batch_lands_where_each_chunk_belongs(order: list[int]) -> None:
    data = np.arange(N_CHUNKS * CHUNK, dtype=np.float32) + 0.5
    size = 4 * CHUNK
    datagrams = [
        encode_data(
            DataHeader(job=JOB, step=0, msg=0, seq=s, offset=s * CHUNK,
                       msg_elems=len(data), payload_len=size, dtype=DType.FLOAT32,
                       flags=Flags.LAST if s == N_CHUNKS - 1 else Flags.NONE),
            data[s * CHUNK : (s + 1) * CHUNK].tobytes(),
        )
        for s in order
    ]
    buf = np.frombuffer(b"".join(datagrams), dtype=np.uint8)
    batch = parse_batch(buf, len(datagrams[0]), job=JOB)
    assert batch.ok.all()
    r = Reassembler(dtype=DType.FLOAT32, msg_elems=len(data), chunk_elems=CHUNK, out=None,
                    bound=0.0, fill=FillPolicy.ZERO, now=0.0)
    r.out[:] = -1
    assert r.scatter(batch.headers, batch.payloads, now=0.0) == len(order)
    for s in range(N_CHUNKS):
        got = r.out[s * CHUNK : (s + 1) * CHUNK]
        want = data[s * CHUNK : (s + 1) * CHUNK] if s in order else np.full(CHUNK, -1.0)
        np.testing.assert_array_equal(got, want, err_msg=f"chunk {s}")
