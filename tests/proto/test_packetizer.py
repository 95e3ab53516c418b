"""Packetizer: the chunk-layer cache of plan_message, the records build_records lays
out, and the first round that the C accelerator plans in one pass."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dlcp.proto import first_round as first_round_module
from dlcp.proto import kernels, packetizer
from dlcp.proto.chunk_layers import chunk_layers
from dlcp.proto.classify import Classifier, make_classifier
from dlcp.proto.first_round import FirstRound, first_round, plan_first_round
from dlcp.proto.packetizer import (
    ChunkTable,
    MessageId,
    build_records,
    header_template,
    plan_message,
)
from dlcp.proto.wire import (
    AUTH_TRAILER_LEN,
    DATA_HEADER_LEN,
    HEADER_DTYPE,
    DType,
    Flags,
    message_header,
)

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


def _random_table(rng: np.random.Generator, n_elems: int, chunk_elems: int, dtype: DType):
    """A table with every class mixed in (what no classifier gives in one message)."""
    n = -(-n_elems // chunk_elems)
    return ChunkTable(
        dtype=dtype,
        msg_elems=n_elems,
        chunk_elems=chunk_elems,
        layer=rng.integers(0, 1 << 16, n).astype(np.uint16),
        prio=rng.integers(0, 8, n).astype(np.uint8),
        drop=rng.integers(0, 2, n).astype(bool),
        mag=rng.integers(0, 16, n).astype(np.uint8),
        magnitude=np.zeros(n, np.float32),
    )


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
@pytest.mark.parametrize("authenticate", [False, True])
@pytest.mark.parametrize("lend", [False, True])
def test_c_first_round_gives_what_send_order_and_build_records_give(
    authenticate: bool, lend: bool
) -> None:
    rng = np.random.default_rng(11)
    ident = MessageId(job=0xBEEF, step=0xFFFFFFFF, msg=7, src=3, bound=50)
    cases = [(1, 16, DType.FLOAT32), (16, 16, DType.FLOAT32), (17, 16, DType.FLOAT32),
             (5000, 360, DType.FLOAT32), (4099, 720, DType.FLOAT16),
             (70000, 4, DType.BFLOAT16)]  # fmt: skip
    for n_elems, chunk_elems, dtype in cases:
        source = rng.integers(0, 256, n_elems * dtype.itemsize).astype(np.uint8)
        table = _random_table(rng, n_elems, chunk_elems, dtype)
        got = first_round(source, table, ident, authenticate=authenticate, lend=lend,
                          accelerated=True)  # fmt: skip
        want = first_round(source, table, ident, authenticate=authenticate, lend=lend,
                           accelerated=False)  # fmt: skip
        np.testing.assert_array_equal(got[1], table.send_order())
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[2], want[2])
        assert got.class_chunks == want.class_chunks == table.class_chunks()
        run, ref = got[0], want[0]
        # (the authentication trailer's room is written when a record is sealed)
        written = run.records.shape[1] - (AUTH_TRAILER_LEN if authenticate else 0)
        np.testing.assert_array_equal(run.records[:, :written], ref.records[:, :written])
        for name in ("lengths", "seq", "prio", "drop", "breaks"):
            np.testing.assert_array_equal(getattr(run, name), getattr(ref, name), err_msg=name)
        assert (run.short, run.stride) == (ref.short, ref.stride)
        assert (run.payload is None) == (ref.payload is None) == (not lend)


def test_message_header_is_the_template_on_the_wire() -> None:
    table = _random_table(np.random.default_rng(3), 70000, 4, DType.BFLOAT16)
    ident = MessageId(job=0xBEEF, step=0xFFFFFFFF, msg=0xFFFF, src=513, bound=255)
    want = header_template(ident, table).astype(HEADER_DTYPE).tobytes()
    got = message_header(ident.job, ident.step, ident.msg, table.msg_elems, ident.src,
                         table.dtype, ident.bound)  # fmt: skip
    assert got == want


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_kernels_take_arrays_as_they_are_and_copy_only_what_they_cannot_read() -> None:
    ready = np.arange(8, dtype=np.uint16)
    assert kernels._aligned(ready, np.uint16) is ready
    for unready in (ready[::2], ready.astype(np.int64), ready.view(np.uint8)[1:15].view(np.uint16),
                    ready.tolist()):  # fmt: skip
        got = kernels._aligned(unready, np.uint16)  # type: ignore[arg-type]
        assert got is not unready and got.dtype == np.uint16
        assert got.flags.c_contiguous and got.flags.aligned
        np.testing.assert_array_equal(got, np.asarray(unready).astype(np.uint16))


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_c_plan_round_names_a_bad_class_and_writes_nothing() -> None:
    table = _random_table(np.random.default_rng(2), 64, 16, DType.FLOAT32)
    prio = table.prio.copy()
    prio[2] = 8
    records = np.full((4, DATA_HEADER_LEN), 0xAA, np.uint8)
    with pytest.raises(ValueError, match="chunk 2 has prio 8"):
        kernels.plan_round(
            records, bytes(DATA_HEADER_LEN), bytes([1, 10, 12, 16, 24, 28]), prio, table.drop,
            table.mag, table.layer, 16, 64, 4, 0, int(Flags.LAST), None,
        )  # fmt: skip
    with pytest.raises(ValueError, match="4 chunks needs 4 one-byte prio"):
        kernels.plan_round(
            records, bytes(DATA_HEADER_LEN), bytes([1, 10, 12, 16, 24, 28]), table.prio[:3],
            table.drop, table.mag, table.layer, 16, 64, 4, 0, int(Flags.LAST), None,
        )  # fmt: skip
    assert (records == 0xAA).all()


def _same_table(got: ChunkTable, want: ChunkTable, label: str) -> None:
    for field in ("layer", "prio", "drop", "mag", "magnitude"):
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype, f"{label} {field}"
        np.testing.assert_array_equal(a, b, err_msg=f"{label} {field}")
    assert (got.dtype, got.msg_elems, got.chunk_elems) == (
        want.dtype, want.msg_elems, want.chunk_elems)  # fmt: skip


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_float32_plan_in_the_kernels_alone_gives_the_general_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """plan_message's float32 path (magnitudes and classes from the C kernels,
    without the general path's wrappers) gives the same table, bit for bit,
    NaN, infinities, short last chunks and the loss bound's no-drop rule included."""
    rng = np.random.default_rng(23)
    fast = packetizer._plan_float32
    taken = []

    def counted(*args: object) -> ChunkTable | None:
        table = fast(*args)  # type: ignore[arg-type]
        taken.append(table is not None)
        return table

    cases = 0
    for name in ("layer", "magnitude", "combined", "none"):
        classifier = make_classifier(name)
        for n_elems in (1, 16, 17, 2237, 65537):
            for chunk_bytes, sample in ((64, 1), (1400, 17), (8952, 100)):
                for p in (None, 0.0, 0.05):
                    scale = rng.choice([1e-6, 1.0, 1e6])
                    data = (rng.standard_normal(n_elems) * scale).astype(np.float32)
                    if n_elems > 5:
                        data[rng.integers(0, n_elems, 3)] = [np.nan, np.inf, -np.inf]
                    half = n_elems // 2
                    segments = [(0, half, 0), (half, n_elems - half, 1)] if half else None
                    args = {"chunk_bytes": chunk_bytes, "classifier": classifier,
                            "segments": segments, "magnitude_sample": sample,
                            "loss_bound": p}  # fmt: skip
                    monkeypatch.setattr(packetizer, "_plan_float32", counted)
                    got = plan_message(data, DType.FLOAT32, **args)
                    monkeypatch.setattr(packetizer, "_plan_float32", lambda *a: None)
                    want = plan_message(data, DType.FLOAT32, **args)
                    _same_table(got, want, f"{name} {n_elems}")
                    cases += 1
    assert len(taken) == cases and all(taken)  # (the kernels' path planned every one)


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_float32_plan_leaves_to_the_general_path_what_it_cannot_read_as_it_is() -> None:
    """float64 values named float32, a strided array and a sample as large as a
    chunk go the general way (which converts and samples them); the table is
    then what that path gives."""
    values = np.random.default_rng(5).standard_normal(300)
    classifier = make_classifier("combined")
    args = {"chunk_bytes": 64, "classifier": classifier, "segments": None}
    for data, sample in ((values, 4), (values.astype(np.float32)[::2], 4),
                         (values.astype(np.float32), 16)):  # fmt: skip
        layers = np.zeros(-(-len(data) // 16), np.uint16)
        shape = packetizer.message_shape(data, DType.FLOAT32, 64, segments=None, loss_bound=None)
        assert packetizer._plan_float32(data, shape, classifier, sample) is None
        table = plan_message(data, DType.FLOAT32, magnitude_sample=sample, **args)
        want = np.abs(data[:16].astype(np.float32)).mean(dtype=np.float64)
        if sample >= 16:  # (all of the first chunk's values: the mean of their magnitudes)
            assert table.magnitude[0] == np.float32(want)
        assert len(table.magnitude) == len(layers)


def _same_round(got: FirstRound, want: FirstRound, authenticate: bool) -> None:
    np.testing.assert_array_equal(got.order, want.order)
    np.testing.assert_array_equal(got.row_of_seq, want.row_of_seq)
    assert got.class_chunks == want.class_chunks
    run, ref = got.run, want.run
    # (the authentication trailer's room is written when a record is sealed)
    written = run.records.shape[1] - (AUTH_TRAILER_LEN if authenticate else 0)
    assert run.records.shape == ref.records.shape
    np.testing.assert_array_equal(run.records[:, :written], ref.records[:, :written])
    for name in ("lengths", "seq", "prio", "drop", "breaks"):
        np.testing.assert_array_equal(getattr(run, name), getattr(ref, name), err_msg=name)
    assert (run.short, run.stride) == (ref.short, ref.stride)
    assert (run.payload is None) == (ref.payload is None)
    if run.payload is not None:
        np.testing.assert_array_equal(run.payload, ref.payload)


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_send_planned_in_one_call_gives_the_table_and_round_of_the_two_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """plan_first_round's one call of plan_send (sampling, classes, send order,
    records) gives what plan_message and first_round give one after the other,
    bit for bit: NaN, infinities, short last chunks, the loss bound's no-drop
    rule, lent and authenticated rounds, a buffer taken or refused."""
    rng = np.random.default_rng(29)
    fused = first_round_module._plan_send
    taken = []

    def counted(*args: object) -> object:
        got = fused(*args)  # type: ignore[arg-type]
        taken.append(got is not None)
        return got

    ident = MessageId(job=0xBEEF, step=0xFFFFFFFF, msg=7, src=3, bound=50)
    cases = 0
    for name in ("layer", "magnitude", "combined", "none"):
        classifier = make_classifier(name)
        for n_elems in (1, 16, 17, 2237, 65537):
            for chunk_bytes, sample in ((64, 1), (1400, 17), (8952, 100)):
                p = (None, 0.0, 0.05)[cases % 3]
                authenticate, lend = bool(cases & 4), bool(cases & 8)
                data = (rng.standard_normal(n_elems) * rng.choice([1e-6, 1e6])).astype(np.float32)
                if n_elems > 5:
                    data[rng.integers(0, n_elems, 3)] = [np.nan, np.inf, -np.inf]
                half = n_elems // 2
                args: dict[str, Any] = {"chunk_bytes": chunk_bytes, "classifier": classifier,
                        "segments": [(0, half, 0), (half, n_elems - half, 1)] if half else None,
                        "magnitude_sample": sample, "loss_bound": p}  # fmt: skip
                shapes: list[tuple[int, int]] = []

                def take(
                    shape: tuple[int, int],
                    shapes: list[tuple[int, int]] = shapes,
                    refuse: bool = bool(cases % 2),
                ) -> np.ndarray | None:
                    shapes.append(shape)
                    return None if refuse else np.full(shape, 0xAA, np.uint8)

                monkeypatch.setattr(first_round_module, "_plan_send", counted)
                table, got = plan_first_round(
                    data, DType.FLOAT32, ident, **args, authenticate=authenticate, lend=lend,
                    take=take,
                )  # fmt: skip
                want_table = plan_message(data, DType.FLOAT32, **args)
                want = first_round(
                    data.view(np.uint8), want_table, ident, authenticate=authenticate, lend=lend,
                    accelerated=False,
                )  # fmt: skip
                _same_table(table, want_table, f"{name} {n_elems}")
                _same_round(got, want, authenticate)
                assert shapes == [want.run.records.shape]
                cases += 1
    assert len(taken) == cases and all(taken)  # (one call planned every one)


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_sends_the_one_call_cannot_take_are_planned_in_two_steps() -> None:
    """float16 values, a sample as large as a chunk, a classifier of the user's
    own and float32 values off their alignment go through plan_message and
    first_round, with the same outcome."""
    rng = np.random.default_rng(31)
    ident = MessageId(job=1, step=2, msg=3, src=0, bound=50)

    class Halves(Classifier):  # (not a built-in: the kernels cannot run it)
        def classify(self, layers, magnitudes, *, n_layers):  # type: ignore[no-untyped-def]
            return make_classifier("combined").classify(layers, magnitudes, n_layers=n_layers)

    values = rng.standard_normal(3001).astype(np.float32)
    # (float32 values one byte off their alignment: contiguous, but not for C loads)
    unaligned = np.frombuffer(b"\0" + values.tobytes(), np.float32, offset=1)
    assert unaligned.flags.c_contiguous and not unaligned.flags.aligned
    for data, dtype, sample, classifier in (
        (values.astype(np.float16), DType.FLOAT16, 4, make_classifier("combined")),
        (values, DType.FLOAT32, 16, make_classifier("combined")),
        (values, DType.FLOAT32, 4, Halves()),
        (unaligned, DType.FLOAT32, 4, make_classifier("combined")),
    ):
        args: dict[str, Any] = {"chunk_bytes": 64, "classifier": classifier, "segments": None,
                                "magnitude_sample": sample}  # fmt: skip
        assert first_round_module._plan_send(
            data, packetizer.message_shape(data, dtype, 64, segments=None, loss_bound=None),
            ident, classifier, sample, False, False, None,
        ) is None  # fmt: skip
        table, got = plan_first_round(data, dtype, ident, **args, authenticate=False)
        want_table = plan_message(data, dtype, **args)
        np.testing.assert_array_equal(table.drop, want_table.drop)
        want = first_round(data.view(np.uint8), want_table, ident, authenticate=False,
                           accelerated=False)  # fmt: skip
        _same_round(got, want, False)


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_c_plan_send_names_what_does_not_fit_and_writes_nothing() -> None:
    data = np.ones(64, np.float32)
    starts = np.zeros(1, np.int64)
    layers = np.zeros(4, np.uint16)
    rule = (np.zeros(1, np.uint8), None, -1.0, 0.0, 20, 15)
    header, layout = bytes(DATA_HEADER_LEN), bytes([1, 10, 12, 16, 24, 28])

    def plan(records: np.ndarray, **changes: object) -> object:
        a = {"layer": layers, "n_layers": 1, "rule": rule, "classes": np.empty(20, np.uint8)}
        a.update(changes)
        return kernels.plan_send(
            data, 16, starts, 16, 0.0, a["layer"], a["n_layers"], a["rule"], True, records,  # type: ignore[arg-type]
            header, layout, 0, int(Flags.LAST), lend=True, stream=False,
            magnitude=np.empty(4, np.float32), classes=a["classes"], order=np.empty(8, np.int64),  # type: ignore[arg-type]
        )  # fmt: skip

    records = np.full((4, DATA_HEADER_LEN), 0xAA, np.uint8)
    with pytest.raises(ValueError, match="layer 0 has prio 8"):
        plan(records, rule=(np.full(1, 8, np.uint8), None, -1.0, 0.0, 20, 15))
    with pytest.raises(ValueError, match="4 chunks needs aligned uint16 layers"):
        plan(records, classes=np.empty(19, np.uint8))
    with pytest.raises(ValueError, match="0 <= top <= 15"):
        plan(records, rule=(np.zeros(1, np.uint8), None, -1.0, 0.0, 20, 16))
    # a layer not below n_layers: nothing is laid out (plan_message names it)
    assert plan(records, layer=np.array([0, 0, 1, 0], np.uint16)) is None
    assert (records == 0xAA).all()
    assert plan(records) == (0,) * 14 + (4, 0)  # (all of class 0, protected: key 14)
    assert (records[:, :DATA_HEADER_LEN] != 0xAA).any()


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_c_plans_refuse_sizes_whose_products_would_wrap() -> None:
    """A chunk of 2**62 elements or rows of 2**62 bytes (only a direct call of the
    accelerator can name them) are refused, not multiplied past the int64 range
    into a check they would then pass."""
    accel = kernels._accel
    assert accel is not None
    data, records = np.ones(64, np.float32), np.zeros((4, DATA_HEADER_LEN), np.uint8)
    header, layout = bytes(DATA_HEADER_LEN), bytes([1, 10, 12, 16, 24, 28])
    u8, i64 = np.zeros(4, np.uint8), np.zeros(4, np.int64)
    with pytest.raises(ValueError, match="chunks of at most 65535 bytes"):
        accel.plan_round(records.reshape(-1), 2**62, header, layout, u8, u8, u8,
                         np.zeros(1, np.uint16), 2**62, 64, 4, 0, 1, data.view(np.uint8),
                         i64[:1], i64[:1], u8[:1], u8[:1], False)  # fmt: skip
    with pytest.raises(ValueError, match="4 rows of 4611686018427387904 record bytes"):
        accel.plan_round(records.reshape(-1), 2**62, header, layout, u8, u8, u8,
                         np.zeros(4, np.uint16), 16, 64, 4, 0, 1, None, i64, i64, u8.copy(),
                         u8.copy(), False)  # fmt: skip
    with pytest.raises(ValueError, match="4 rows of 4611686018427387904 record bytes"):
        accel.plan_send(data, 16, np.zeros(1, np.int64), 16, 0.0, np.zeros(4, np.uint16), 1,
                        np.zeros(1, np.uint8), None, -1.0, 0.0, True, 20, 15,
                        records.reshape(-1), 2**62, header, layout, 0, 1, True, False,
                        np.empty(4, np.float32), np.empty(20, np.uint8),
                        np.empty(8, np.int64))  # fmt: skip
    assert not records.any()
