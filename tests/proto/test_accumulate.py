"""A message received with ``accumulate``: each chunk's float32 values are added to
what the buffer holds, once, whichever receive path takes it (the general path, the
run kernel, a single packet), a chunk sent twice is added once, a lost chunk adds
nothing, and what arrived before the caller's buffer came is added to it then."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.errors import UsageError
from dlcp.proto import kernels
from dlcp.proto.batch import SHARED_HEADER_MASK, parse_batch
from dlcp.proto.config import FillPolicy
from dlcp.proto.reassembler import RUN_LAYOUT, Reassembler, check_accumulate
from dlcp.proto.wire import DATA_HEADER_LEN, DataHeader, DType, Flags, encode_data

JOB = 9
CHUNK = 4  # elements per chunk
MSG = 22  # elements: five whole chunks and a last one of two
N_CHUNKS = -(-MSG // CHUNK)

rng = np.random.default_rng(5)
SENT = rng.standard_normal(MSG).astype(np.float32)
BASE = rng.standard_normal(MSG).astype(np.float32)


def _datagram(seq: int) -> bytes:
    start = seq * CHUNK
    payload = SENT[start : start + CHUNK].tobytes()
    last = Flags.LAST if seq == N_CHUNKS - 1 else Flags.NONE
    header = DataHeader(job=JOB, step=1, msg=2, seq=seq, offset=start, msg_elems=MSG,
                        payload_len=len(payload), dtype=DType.FLOAT32, flags=last)  # fmt: skip
    return encode_data(header, payload)


def _adding(out: np.ndarray | None = None) -> Reassembler:
    out = BASE.copy() if out is None else out
    return Reassembler(dtype=DType.FLOAT32, msg_elems=MSG, chunk_elems=CHUNK, out=out,
                       bound=0.25, fill=FillPolicy.ZERO, now=0.0, accumulate=True)  # fmt: skip


def _deliver(r: Reassembler, seqs: list[int], path: str) -> int:
    """Chunks ``seqs`` into ``r`` by ``path``; how many were new."""
    grams = [_datagram(s) for s in seqs]
    if path == "run":  # the run kernel takes datagrams of one stride: the whole chunks
        assert all(len(g) == len(grams[0]) for g in grams)
        buf = np.frombuffer(b"".join(grams), dtype=np.uint8)
        head = buf[:DATA_HEADER_LEN]
        taken, fresh, _ = r.scatter_run(buf, len(grams[0]), dtype_byte=int(head[29]),
                                        msg_elems=MSG, now=1.0)  # fmt: skip
        assert taken == len(grams)
        return fresh
    fresh = 0
    for batch_grams in [grams] if path == "batch" else [[g] for g in grams]:
        stride = max(len(g) for g in batch_grams)
        buf = np.frombuffer(b"".join(g.ljust(stride, b"\0") for g in batch_grams), np.uint8)
        batch = parse_batch(buf[: len(buf) - (stride - len(batch_grams[-1]))], stride, job=JOB)
        assert batch.ok.all()
        fresh += r.scatter(batch.headers, batch.payloads, now=1.0)
    return fresh


def _want(seqs: set[int]) -> np.ndarray:
    want = BASE.copy()
    for s in seqs:
        want[s * CHUNK : (s + 1) * CHUNK] += SENT[s * CHUNK : (s + 1) * CHUNK]
    return want


@pytest.mark.parametrize(
    ("path", "seqs"),
    [
        ("batch", [0, 3, 1, 3, 5]),  # out of order, a duplicate, the short last chunk
        ("batch", [2, 5]),
        ("batch", [1, 2, 3]),  # whole chunks in order: one straight run of rows
        ("batch", [3, 0, 2]),  # whole chunks out of order
        ("one", [4, 4, 0]),  # single packets, one twice
        ("run", [0, 1, 2, 2, 4]),  # the run kernel, a duplicate inside the run
    ],
)
def test_each_chunk_is_added_once(path: str, seqs: list[int]) -> None:
    if path == "run" and not kernels.ACCELERATED:
        pytest.skip("the run kernel is C only")
    r = _adding()
    assert _deliver(r, seqs, path) == len(set(seqs))
    np.testing.assert_array_equal(r.out, _want(set(seqs)))
    assert r.received_elems == sum(min(CHUNK, MSG - s * CHUNK) for s in set(seqs))
    assert r.duplicates == len(seqs) - len(set(seqs))
    _deliver(r, seqs, path if path != "run" else "batch")  # all of them again: nothing added
    np.testing.assert_array_equal(r.out, _want(set(seqs)))


def test_a_lost_chunk_adds_nothing() -> None:
    r = _adding()
    _deliver(r, [0, 1, 3, 5], "batch")
    report = r.complete(now=2.0)
    assert report.lost_ranges == ((8, 4), (16, 4)) and report.fill is FillPolicy.ZERO
    np.testing.assert_array_equal(r.out, _want({0, 1, 3, 5}))  # (+ 0 where lost)


def test_what_arrived_before_the_buffer_is_added_to_it() -> None:
    early = Reassembler(dtype=DType.FLOAT32, msg_elems=MSG, chunk_elems=CHUNK, out=None,
                        bound=0.0, fill=FillPolicy.ZERO, now=0.0)  # fmt: skip
    _deliver(early, [1, 5], "batch")  # into the message's own buffer, copied
    out = BASE.copy()
    early.replace_output(out, accumulate=True)
    assert early.out is out and early.accumulate
    np.testing.assert_array_equal(out, _want({1, 5}))
    _deliver(early, [0, 2, 5], "batch")  # the rest lands in out, added
    np.testing.assert_array_equal(out, _want({0, 1, 2, 5}))


@pytest.mark.parametrize(
    ("dtype", "fill", "out", "words"),
    [
        (DType.FLOAT16, FillPolicy.ZERO, BASE, "float32 message, not float16"),
        (DType.FLOAT32, FillPolicy.RESCALE, BASE, "fill='zero', not fill='rescale'"),
        (DType.FLOAT32, FillPolicy.PREVIOUS, BASE, "fill='zero', not fill='previous'"),
        (DType.FLOAT32, FillPolicy.ZERO, None, "needs out="),
        (DType.FLOAT32, FillPolicy.ZERO, BASE.astype(np.float64), "float32 out, not float64"),
    ],
)
def test_what_cannot_be_accumulated_is_refused(
    dtype: DType, fill: FillPolicy, out: np.ndarray | None, words: str
) -> None:
    with pytest.raises(UsageError, match=words):
        check_accumulate(dtype, fill, out)


def test_a_reassembler_refuses_to_add_to_its_own_buffer() -> None:
    with pytest.raises(UsageError, match="needs out="):
        Reassembler(dtype=DType.FLOAT32, msg_elems=MSG, chunk_elems=CHUNK, out=None, bound=0.0,
                    fill=FillPolicy.ZERO, now=0.0, accumulate=True)  # fmt: skip


@pytest.mark.parametrize("accelerated", [False, True])
@pytest.mark.parametrize("dst_rows", [None, [3, 0, 2]])
def test_copy_rows_adds_float32_rows(accelerated: bool, dst_rows: list[int] | None) -> None:
    if accelerated and not kernels.ACCELERATED:
        pytest.skip("no C kernels")
    row = 24  # bytes: six float32 values
    src = rng.standard_normal(3 * 6).astype(np.float32)
    dst = rng.standard_normal(4 * 6).astype(np.float32)
    want = dst.copy().reshape(4, 6)
    rows = [0, 1, 2] if dst_rows is None else dst_rows
    for i, d in enumerate(rows):
        want[d] += src.reshape(3, 6)[i]
    kernels.copy_rows(dst.view(np.uint8), 0, row,
                      None if dst_rows is None else np.array(dst_rows, np.int64),
                      src.view(np.uint8), 0, row, None, 3, row, add=True,
                      accelerated=accelerated)  # fmt: skip
    np.testing.assert_array_equal(dst.reshape(4, 6), want)
    with pytest.raises(ValueError, match="not float32 values"):
        kernels.copy_rows(dst.view(np.uint8), 0, row, None, src.view(np.uint8), 0, row, None,
                          1, 6, add=True, accelerated=accelerated)  # fmt: skip


def test_the_run_kernel_adds_float32_only() -> None:
    if not kernels.ACCELERATED:
        pytest.skip("the run kernel is C only")
    gram = np.frombuffer(_datagram(0), np.uint8)
    with pytest.raises(ValueError, match="add needs float32 elements"):
        kernels.scatter_run(gram, len(gram), gram[:DATA_HEADER_LEN].tobytes(),
                            SHARED_HEADER_MASK, RUN_LAYOUT, np.zeros(2 * MSG, np.uint8), CHUNK,
                            MSG, 2, np.zeros(N_CHUNKS, np.bool_), np.zeros(N_CHUNKS, np.uint8),
                            stream=False, add=True)  # fmt: skip
