"""The layer of each chunk, from a message's layer segments."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcp.proto import chunk_layers as chunk_layers_module
from dlcp.proto.chunk_layers import chunk_layers


def test_chunk_layers_majority_rule() -> None:
    # chunks of 5 over 20 elements: [0,5) [5,10) [10,15) [15,20)
    segs = [(0, 7, 0), (7, 6, 1), (13, 7, 2)]
    out = chunk_layers(segs, 4, 5, 20)
    # chunk 1: layer0 2 elems, layer1 3 -> 1; chunk 2: layer1 3, layer2 2 -> 1
    assert out.layers.tolist() == [0, 1, 1, 2]
    assert out.n_layers == 3
    assert out.layers.dtype == np.uint16


def test_chunk_layers_sums_a_layers_segments_and_breaks_ties_low() -> None:
    # one chunk of 7: layer 1 in two segments (2 + 2) beats layer 0 (3)
    out = chunk_layers([(0, 2, 1), (2, 3, 0), (5, 2, 1)], 1, 7, 7)
    assert out.layers.tolist() == [1]
    # tie 3 vs 3 -> the lower layer number
    tie = chunk_layers([(0, 3, 5), (3, 3, 2)], 1, 6, 6)
    assert tie.layers.tolist() == [2] and tie.n_layers == 6


def test_chunk_layers_short_last_chunk_and_any_order() -> None:
    # 11 elements in chunks of 5: the last chunk is one element
    out = chunk_layers([(10, 1, 3), (0, 10, 0)], 3, 5, 11)
    assert out.layers.tolist() == [0, 0, 3]
    assert out.n_layers == 4


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=25),
    layers=st.lists(st.integers(0, 9), min_size=25, max_size=25),
    chunk=st.integers(1, 30),
    seed=st.integers(0, 2**16),
)
def test_chunk_layers_matches_an_element_by_element_count(
    lengths: list[int], layers: list[int], chunk: int, seed: int
) -> None:
    msg = sum(lengths)
    if msg == 0:
        return
    offsets = np.cumsum([0, *lengths[:-1]])
    segs = [(int(o), n, layers[i]) for i, (o, n) in enumerate(zip(offsets, lengths, strict=True))]
    np.random.default_rng(seed).shuffle(segs)
    n_chunks = -(-msg // chunk)
    got = chunk_layers(segs, n_chunks, chunk, msg)
    # reference: the layer of every element, counted per chunk
    elem_layer = np.repeat([s[2] for s in sorted(segs)], [s[1] for s in sorted(segs)])
    want = [
        int(np.argmax(np.bincount(elem_layer[c * chunk : (c + 1) * chunk], minlength=10)))
        for c in range(n_chunks)
    ]
    assert got.layers.tolist() == want
    assert got.n_layers == max(layers[: len(lengths)]) + 1


@pytest.mark.parametrize("few", [0, 16, 10_000])
def test_chunk_layers_one_by_one_and_vectorised_agree(
    few: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 300 segments of 1..9 elements in chunks of 7: hundreds of straddling chunks,
    # resolved one by one (few=10_000), vectorised (few=0) or the default way
    monkeypatch.setattr(chunk_layers_module, "_FEW_STRADDLERS", few)
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 10, 300)
    layers = rng.integers(0, 40, 300)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    msg = int(lengths.sum())
    segs = [(int(o), int(n), int(y)) for o, n, y in zip(offsets, lengths, layers, strict=True)]
    got = chunk_layers(segs, -(-msg // 7), 7, msg)
    elem_layer = np.repeat(layers, lengths)
    want = [
        int(np.argmax(np.bincount(elem_layer[c * 7 : (c + 1) * 7], minlength=40)))
        for c in range(-(-msg // 7))
    ]
    assert got.layers.tolist() == want


def test_chunk_layers_without_segments() -> None:
    no_segments: tuple[list[tuple[int, int, int]] | None, ...] = (None, [])
    for segs in no_segments:
        out = chunk_layers(segs, 3, 4, 10)
        assert out.layers.tolist() == [0, 0, 0] and out.n_layers == 1


def test_chunk_layers_ignores_empty_segments() -> None:
    out = chunk_layers([(0, 4, 0), (4, 0, 1), (4, 4, 2)], 2, 4, 8)
    assert out.layers.tolist() == [0, 2] and out.n_layers == 3


@pytest.mark.parametrize(
    ("segs", "needle"),
    [
        ([(0, 6, 0), (5, 5, 1)], r"overlap: \[0, 6\) and \[5, 10\)"),
        ([(0, 4, 0), (5, 5, 1)], r"gap: elements \[4, 5\)"),
        ([(1, 9, 0)], r"gap: elements \[0, 1\)"),
        ([(0, 8, 0)], r"gap: elements \[8, 10\)"),
        ([(0, 5, 0), (5, 6, 1)], r"beyond the message \(msg_elems=10\)"),
        ([(0, 10, 70000)], "layer must be 0..65535"),
        ([(0, -1, 0), (0, 10, 0)], "length must be >= 0"),
        ([(0, 10)], "triples"),
    ],
)
def test_chunk_layers_errors(segs: list[tuple[int, ...]], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        chunk_layers(segs, 2, 5, 10)  # type: ignore[arg-type]


def test_chunk_layers_checks_chunk_geometry() -> None:
    with pytest.raises(ValueError, match=r"n_chunks=3 .*\(expected 2\)"):
        chunk_layers(None, 3, 5, 10)
    with pytest.raises(ValueError, match="chunk_elems=0"):
        chunk_layers(None, 0, 0, 10)


@settings(max_examples=80)
@given(data=st.data())
def test_chunk_layers_matches_reference(data: st.DataObject) -> None:
    lengths = data.draw(st.lists(st.integers(1, 30), min_size=1, max_size=12))
    layers = data.draw(st.lists(st.integers(0, 6), min_size=len(lengths), max_size=len(lengths)))
    chunk = data.draw(st.integers(1, 25))
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    segs = [(int(o), n, lay) for o, n, lay in zip(offsets, lengths, layers, strict=True)]
    total = int(sum(lengths))
    n_chunks = -(-total // chunk)
    out = chunk_layers(list(reversed(segs)), n_chunks, chunk, total)
    owner = np.repeat(layers, lengths)  # layer of every element
    for i in range(n_chunks):
        counts = np.bincount(owner[i * chunk : (i + 1) * chunk], minlength=7)
        assert out.layers[i] == int(np.argmax(counts))  # argmax: lowest layer on ties
    assert out.n_layers == max(layers) + 1
