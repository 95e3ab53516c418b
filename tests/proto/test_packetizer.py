"""Packetizer: the chunk-layer cache of plan_message and the records build_records lays out."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.proto.classify import chunk_layers, make_classifier
from dlcp.proto.packetizer import MessageId, build_records, plan_message
from dlcp.proto.wire import DATA_HEADER_LEN, HEADER_DTYPE, DType, Flags

CHUNK_BYTES = 64  # 16 float32 per chunk


def _plan(data: np.ndarray, segments: list[tuple[int, int, int]] | None):
    return plan_message(
        data,
        DType.FLOAT32,
        chunk_bytes=CHUNK_BYTES,
        classifier=make_classifier("combined"),
        segments=segments,
    )


def test_remembered_chunk_layers_follow_the_segments_contents() -> None:
    data = np.arange(100, dtype=np.float32)
    segments = [(0, 40, 0), (40, 60, 3)]
    first = _plan(data, segments)
    expected = chunk_layers(segments, 7, 16, 100).layers
    np.testing.assert_array_equal(first.layer, expected)
    again = _plan(data, segments)
    np.testing.assert_array_equal(again.layer, expected)
    assert not again.layer.flags.writeable  # shared between messages: nobody may write it
    segments[1] = (40, 60, 1)  # the same list object, other contents: other layers
    changed = _plan(data, segments)
    np.testing.assert_array_equal(changed.layer, chunk_layers(segments, 7, 16, 100).layers)
    assert changed.layer.max() == 1


def test_bad_segments_are_still_rejected_with_the_cache() -> None:
    data = np.zeros(32, dtype=np.float32)
    with pytest.raises(ValueError, match="segments"):
        _plan(data, [(0, 10, 0), (12, 20, 1)])  # a gap
    with pytest.raises(ValueError):
        _plan(data, [(0, 32)])  # type: ignore[list-item]  # not a triple


@pytest.mark.parametrize(
    ("n_elems", "seqs"),
    [
        (1, [0]),  # one short chunk
        (32, [1, 0]),  # two full chunks: nothing short
        (37, [2, 0, 1]),  # the last chunk (5 elements) short, sent first
        (37, [1]),  # a retransmission-like subset without the last chunk
        (37, [2]),  # only the short last chunk
    ],
)
def test_records_flag_last_and_pad_only_the_last_chunk(n_elems: int, seqs: list[int]) -> None:
    rng = np.random.default_rng(n_elems)
    data = rng.standard_normal(n_elems).astype(np.float32)
    table = _plan(data, None)
    order = np.asarray(seqs, dtype=np.int64)
    ident = MessageId(job=5, step=9, msg=3, src=2, bound=0)
    run = build_records(data.view(np.uint8), table, order, ident, authenticate=False)
    headers = run.records[:, :DATA_HEADER_LEN].copy().view(HEADER_DTYPE)[:, 0]
    last_seq = table.n_chunks - 1
    for row, seq in enumerate(seqs):
        elems = min(16, n_elems - seq * 16)
        assert headers["seq"][row] == seq
        assert headers["offset"][row] == seq * 16
        assert headers["payload_len"][row] == elems * 4
        assert bool(headers["flags"][row] & Flags.LAST) == (seq == last_seq)
        assert run.lengths[row] == DATA_HEADER_LEN + elems * 4
        payload = run.records[row, DATA_HEADER_LEN:]
        np.testing.assert_array_equal(
            payload[: elems * 4].view(np.float32), data[seq * 16 : seq * 16 + elems]
        )
        assert not payload[elems * 4 :].any()  # a short record is zero-padded
    short = [r for r, s in enumerate(seqs) if s == last_seq and n_elems % 16]
    assert run._short == (short[0] if short else -1)
