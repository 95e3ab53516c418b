"""Per-chunk classification: priority from layers, drop eligibility from magnitude."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcp.proto import classify, kernels
from dlcp.proto.classify import (
    ChunkClasses,
    CombinedClassifier,
    LayerClassifier,
    MagnitudeClassifier,
    NoneClassifier,
    available_classifiers,
    magnitude_class,
    make_classifier,
    register_classifier,
)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


# --------------------------------------------------------------------------- magnitude class


def test_magnitude_class_boundaries() -> None:
    m = [0.0, 2.0**-21, 2.0**-20, 2.0**-19, 2.0**-10, 2.0**-6, 2.0**-5, 1.0, 1e30]
    assert magnitude_class(m).tolist() == [0, 0, 0, 1, 10, 14, 15, 15, 15]


def test_magnitude_class_is_exact_just_below_a_power_of_two() -> None:
    # floor(log2) taken from the exponent, not from a rounded logarithm
    below = np.nextafter(np.float32(2.0**-10), np.float32(0))
    assert magnitude_class(np.array([below, 2.0**-10], np.float32)).tolist() == [9, 10]
    assert magnitude_class([np.nextafter(1.0, 0.0)]).tolist() == [15]
    assert magnitude_class([np.nextafter(2.0**-15, 0.0)]).tolist() == [4]


def test_magnitude_class_non_finite_and_negative() -> None:
    out = magnitude_class([np.inf, -np.inf, np.nan, -(2.0**-10)])
    assert out.tolist() == [15, 15, 15, 10]
    assert out.dtype == np.uint8


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=50))
def test_magnitude_class_is_monotone_and_in_range(values: list[float]) -> None:
    m = np.sort(np.array(values, dtype=np.float64))
    out = magnitude_class(m)
    assert np.all((out >= 0) & (out <= 15))
    assert np.all(np.diff(out.astype(int)) >= 0)


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_c_magnitude_class_of_float32_is_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = np.finfo(np.float32).tiny
    special = [0.0, -0.0, tiny / 4, tiny, -tiny, 2.0**-21, 2.0**-20, 2.0**-6, 2.0**-5, 1.0,
               np.finfo(np.float32).max, np.inf, -np.inf, np.nan, -np.nan]  # fmt: skip
    powers = 2.0 ** np.arange(-149, 128, dtype=np.float64)
    near = np.concatenate([powers, np.nextafter(powers.astype(np.float32), np.float32(0))])
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 1 << 32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    m = np.concatenate([np.array(special, np.float32), near.astype(np.float32), bits])
    got = magnitude_class(m)
    monkeypatch.setattr(kernels, "ACCELERATED", False)
    with np.errstate(invalid="ignore"):  # (numpy's frexp of NaN says so; plan_message too)
        want = magnitude_class(m)
    assert got.dtype == want.dtype == np.uint8
    np.testing.assert_array_equal(got, want)
    # an unaligned view (a buffer's bytes from an odd offset) is read as well
    raw = np.zeros(m.nbytes + 1, np.uint8)
    raw[1:] = m.view(np.uint8)
    unaligned = raw[1:].view(np.float32)
    assert not unaligned.flags.aligned
    monkeypatch.setattr(kernels, "ACCELERATED", True)
    np.testing.assert_array_equal(magnitude_class(unaligned), want)


# --------------------------------------------------------------------------- layer policy


def test_layer_front_layers_get_highest_class() -> None:
    layers = np.arange(16)
    out = LayerClassifier().classify(layers, np.ones(16, np.float32), n_layers=16)
    assert out.prio.tolist() == [7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0]
    assert not out.drop.any()
    assert out.prio.dtype == np.uint8 and out.drop.dtype == np.bool_


def test_layer_back_first_reverses() -> None:
    layers = np.arange(16)
    out = LayerClassifier(front_first=False).classify(layers, np.ones(16, np.float32), n_layers=16)
    assert out.prio.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]


def test_layer_fewer_classes_and_single_layer() -> None:
    out = LayerClassifier(n_classes=2).classify(np.array([0, 1, 2, 3]), f32(1, 1, 1, 1), n_layers=4)
    assert out.prio.tolist() == [1, 1, 0, 0]
    one = LayerClassifier().classify(np.zeros(3, np.int64), f32(1, 1, 1), n_layers=1)
    assert one.prio.tolist() == [7, 7, 7]


@given(
    n_layers=st.integers(1, 300),
    n_classes=st.integers(1, 8),
    data=st.data(),
)
def test_layer_prio_is_monotone_in_range_and_mirrored(
    n_layers: int, n_classes: int, data: st.DataObject
) -> None:
    layers = np.array(
        data.draw(st.lists(st.integers(0, n_layers - 1), min_size=1, max_size=64)), dtype=np.int64
    )
    mags = np.ones(len(layers), np.float32)
    front = LayerClassifier(n_classes=n_classes).classify(layers, mags, n_layers=n_layers)
    back = LayerClassifier(n_classes, False).classify(layers, mags, n_layers=n_layers)
    assert np.all(front.prio < n_classes)
    assert np.all(front.prio.astype(int) + back.prio == n_classes - 1)
    order = np.argsort(layers, kind="stable")
    assert np.all(np.diff(front.prio[order].astype(int)) <= 0)
    if n_layers >= n_classes:  # every class is used by some layer
        every = np.arange(n_layers)
        all_prio = (
            LayerClassifier(n_classes)
            .classify(every, np.ones(n_layers, np.float32), n_layers=n_layers)
            .prio
        )
        assert set(all_prio.tolist()) == set(range(n_classes))


# --------------------------------------------------------------------------- magnitude policy


def test_magnitude_fraction_drops_exactly_the_smallest() -> None:
    m = f32(5, 1, 9, 3, 7, 2, 8, 4, 6, 0.5)
    out = MagnitudeClassifier(drop_fraction=0.35).classify(np.zeros(10, int), m, n_layers=1)
    assert out.drop.sum() == 3  # floor(0.35 * 10)
    assert sorted(m[out.drop].tolist()) == [0.5, 1, 2]
    assert not out.prio.any()


def test_magnitude_ties_go_to_the_lower_index() -> None:
    m = f32(1, 1, 1, 1, 1, 1)
    out = MagnitudeClassifier(drop_fraction=0.5).classify(np.zeros(6, int), m, n_layers=1)
    assert out.drop.tolist() == [True, True, True, False, False, False]


def test_magnitude_nan_is_never_dropped() -> None:
    m = f32(np.nan, 0, np.nan, 0)
    out = MagnitudeClassifier(drop_fraction=0.5).classify(np.zeros(4, int), m, n_layers=1)
    assert out.drop.tolist() == [False, True, False, True]
    # even when the fraction asks for more chunks than there are non-NaN ones
    many = MagnitudeClassifier(drop_fraction=0.75).classify(np.zeros(4, int), m, n_layers=1)
    assert many.drop.tolist() == [False, True, False, True]
    assert out.mag.tolist() == [15, 0, 15, 0]
    thr = MagnitudeClassifier(threshold=1e9).classify(np.zeros(4, int), m, n_layers=1)
    assert thr.drop.tolist() == [False, True, False, True]


@given(
    st.lists(st.sampled_from([0.0, 1e-4, 2e-4, 1e-3, 0.5]), min_size=0, max_size=80),
    st.floats(min_value=0.0, max_value=0.99),
)
def test_magnitude_fraction_matches_stable_sort_reference(values: list[float], q: float) -> None:
    m = np.array(values, dtype=np.float32)
    out = MagnitudeClassifier(drop_fraction=q).classify(np.zeros(len(m), int), m, n_layers=1)
    k = int(np.floor(q * len(m)))
    expected = np.zeros(len(m), bool)
    expected[np.argsort(m, kind="stable")[:k]] = True
    assert out.drop.tolist() == expected.tolist()


def test_magnitude_threshold_mode_and_constant_prio() -> None:
    m = f32(0.1, 0.01, 0.001, 0.01)
    out = MagnitudeClassifier(threshold=0.01, prio=3).classify(np.zeros(4, int), m, n_layers=1)
    assert out.drop.tolist() == [False, False, True, False]
    assert out.prio.tolist() == [3, 3, 3, 3]


def test_magnitude_default_drops_nothing() -> None:
    out = MagnitudeClassifier().classify(np.zeros(5, int), f32(1, 2, 3, 4, 5), n_layers=1)
    assert not out.drop.any()


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"drop_fraction": 0.1, "threshold": 0.5}, "not both"),
        ({"drop_fraction": 1.0}, "drop_fraction=1.0"),
        ({"drop_fraction": -0.1}, "drop_fraction=-0.1"),
        ({"threshold": -1.0}, "threshold=-1.0"),
        ({"threshold": float("nan")}, "threshold=nan"),
        ({"prio": 8}, "prio=8"),
    ],
)
def test_magnitude_bad_options(options: dict[str, float], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        MagnitudeClassifier(**options)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- combined


def test_combined_protected_layers_never_droppable() -> None:
    layers = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    m = f32(0.001, 0.002, 5, 6, 0.003, 7, 0.004, 8)
    c = CombinedClassifier(drop_fraction=0.5, protect_layers=frozenset({0}))
    out = c.classify(layers, m, n_layers=4)
    assert not out.drop[layers == 0].any()
    # 6 unprotected chunks, floor(0.5 * 6) = 3 smallest of them
    assert np.flatnonzero(out.drop).tolist() == [2, 4, 6]
    layer_only = LayerClassifier().classify(layers, m, n_layers=4)
    assert out.prio.tolist() == layer_only.prio.tolist()


def test_combined_defaults_and_threshold_mode() -> None:
    assert CombinedClassifier().drop_fraction == 0.1
    c = CombinedClassifier(threshold=0.5, protect_layers=frozenset({1}))
    assert c.drop_fraction is None
    out = c.classify(np.array([0, 1, 2]), f32(0.1, 0.1, 0.9), n_layers=3)
    assert out.drop.tolist() == [True, False, False]


@settings(max_examples=60)
@given(data=st.data())
def test_combined_property(data: st.DataObject) -> None:
    n_layers = data.draw(st.integers(1, 20))
    n = data.draw(st.integers(0, 120))
    layers = np.array(data.draw(st.lists(st.integers(0, n_layers - 1), min_size=n, max_size=n)))
    m = np.array(
        data.draw(st.lists(st.floats(0, 1, width=32), min_size=n, max_size=n)), dtype=np.float32
    )
    protect = frozenset(data.draw(st.sets(st.integers(0, n_layers - 1), max_size=4)))
    q = data.draw(st.floats(0, 0.95))
    out = CombinedClassifier(drop_fraction=q, protect_layers=protect).classify(
        layers.astype(np.int64), m, n_layers=n_layers
    )
    free = ~np.isin(layers, list(protect))
    assert not out.drop[~free].any()
    assert out.drop.sum() == int(np.floor(q * free.sum()))
    if out.drop.any() and (free & ~out.drop).any():
        assert m[out.drop].max() <= m[free & ~out.drop].min()


def test_none_classifier() -> None:
    out = NoneClassifier().classify(np.array([0, 5, 9]), f32(0, 1, 2), n_layers=10)
    assert out.prio.tolist() == [0, 0, 0]
    assert out.drop.tolist() == [False, False, False]
    assert out.mag.tolist() == [0, 15, 15]


# --------------------------------------------------------------------------- registry


def test_registry_names_and_construction() -> None:
    assert {"layer", "magnitude", "combined", "none"} <= set(available_classifiers())
    c = make_classifier("combined", n_classes=4, protect_layers=frozenset({2}))
    assert isinstance(c, CombinedClassifier) and c.n_classes == 4
    assert isinstance(make_classifier("none"), NoneClassifier)
    assert isinstance(make_classifier("magnitude", threshold=0.1), MagnitudeClassifier)


def test_registry_errors_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"unknown classifier 'fancy'.*combined, layer"):
        make_classifier("fancy")
    with pytest.raises(ValueError, match=r"no option 'drop'.*n_classes, front_first"):
        make_classifier("layer", drop=True)
    with pytest.raises(ValueError, match="n_classes=9"):
        make_classifier("layer", n_classes=9)
    with pytest.raises(ValueError, match="n_classes=0"):
        make_classifier("combined", n_classes=0)
    with pytest.raises(ValueError, match="protect_layers"):
        make_classifier("combined", protect_layers=frozenset({-1}))


def test_register_custom_classifier() -> None:
    name = "test-all-droppable"

    @register_classifier(name)
    class AllDroppable:
        def __init__(self, prio: int = 1) -> None:
            self.prio = prio

        def classify(
            self, layers: np.ndarray, magnitudes: np.ndarray, *, n_layers: int
        ) -> ChunkClasses:
            n = len(layers)
            return ChunkClasses(
                np.full(n, self.prio, np.uint8), np.ones(n, bool), magnitude_class(magnitudes)
            )

    try:
        assert name in available_classifiers()
        out = make_classifier(name, prio=2).classify(np.zeros(2, int), f32(1, 1), n_layers=1)
        assert out.prio.tolist() == [2, 2] and out.drop.all()
        with pytest.raises(ValueError, match="already registered"):
            register_classifier(name)(AllDroppable)
    finally:
        classify._REGISTRY.pop(name, None)


def test_classify_input_errors() -> None:
    c = LayerClassifier()
    with pytest.raises(ValueError, match="differ in length"):
        c.classify(np.zeros(3, int), f32(1, 2), n_layers=1)
    with pytest.raises(ValueError, match=r"layer 4 outside 0\.\.3"):
        c.classify(np.array([0, 4]), f32(1, 2), n_layers=4)
    with pytest.raises(ValueError, match="layer -1"):
        c.classify(np.array([0, -1]), f32(1, 2), n_layers=4)
    with pytest.raises(ValueError, match="n_layers=0"):
        c.classify(np.zeros(0, int), f32(), n_layers=0)
    with pytest.raises(ValueError, match="differ in length"):
        ChunkClasses(np.zeros(2, np.uint8), np.zeros(3, bool), np.zeros(2, np.uint8))


# --------------------------------------------------------------------------- the C pass

#: magnitudes that stress the C pass: ties, zeros of both signs, subnormals,
#: infinities, NaN, and values a float32 cannot tell apart from their neighbours
_HARD_MAGNITUDES = np.array(
    [0.0, -0.0, 1e-45, 1e-38, 0.5, 0.5, 1.0, 1.0 + 2**-23, 3.0, 1e30, np.inf, np.nan],
    dtype=np.float32,
)


def _rules() -> list[classify.Classifier]:
    return [
        LayerClassifier(),
        LayerClassifier(n_classes=3, front_first=False),
        MagnitudeClassifier(drop_fraction=0.3, prio=5),
        MagnitudeClassifier(threshold=0.75),
        MagnitudeClassifier(threshold=1e300),  # +inf in float32: everything finite below
        MagnitudeClassifier(),
        CombinedClassifier(),
        CombinedClassifier(drop_fraction=0.999),
        CombinedClassifier(drop_fraction=0.8, protect_layers=frozenset({1, 7, 500})),
        CombinedClassifier(threshold=0.5, n_classes=2, protect_layers=frozenset({0})),
        NoneClassifier(),
    ]


def _assert_same_tags(got: ChunkClasses, want: ChunkClasses) -> None:
    for name in ("prio", "drop", "mag"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_c_pass_gives_the_classifiers_tags(data: st.DataObject) -> None:
    rule = data.draw(st.sampled_from(_rules()))
    n_layers = data.draw(st.integers(1, 12))
    n = data.draw(st.integers(0, 300))
    layers = np.array(
        data.draw(st.lists(st.integers(0, n_layers - 1), min_size=n, max_size=n)), np.uint16
    )
    if data.draw(st.booleans()):  # from a few values: many ties
        picks = data.draw(st.lists(st.integers(0, len(_HARD_MAGNITUDES) - 1), min_size=n,
                                   max_size=n))  # fmt: skip
        magnitudes = _HARD_MAGNITUDES[np.array(picks, np.int64)]
    else:
        magnitudes = np.array(
            data.draw(st.lists(st.floats(width=32, allow_nan=True), min_size=n, max_size=n)),
            np.float32,
        )
    with np.errstate(invalid="ignore", over="ignore"):
        want = rule.classify(layers, magnitudes, n_layers=n_layers)
        got = classify.classify_chunks(rule, layers, magnitudes, n_layers=n_layers)
        _assert_same_tags(got, want)
        held = classify.classify_chunks(rule, layers, magnitudes, n_layers=n_layers,
                                        may_drop=False)  # fmt: skip
    assert not held.drop.any()
    np.testing.assert_array_equal(held.prio, want.prio)
    np.testing.assert_array_equal(held.mag, want.mag)


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_c_pass_ranks_a_message_of_many_chunks_as_numpy_does() -> None:
    # (the radix select's later digits only matter where many values share the first)
    rng = np.random.default_rng(5)
    n = 50_000
    magnitudes = np.abs(rng.standard_normal(n)).astype(np.float32) * 1e-3
    magnitudes[rng.integers(0, n, 2000)] = magnitudes[7]  # a big tie at one value
    magnitudes[rng.integers(0, n, 50)] = np.nan
    layers = rng.integers(0, 40, n).astype(np.uint16)
    rules = [CombinedClassifier(drop_fraction=q) for q in (0.01, 0.1, 0.5, 0.8, 0.999)]
    rules += [CombinedClassifier(drop_fraction=0.8, protect_layers=frozenset(range(0, 40, 3)))]
    for rule in rules:
        want = rule.classify(layers, magnitudes, n_layers=40)
        _assert_same_tags(classify.classify_chunks(rule, layers, magnitudes, n_layers=40), want)


def test_other_classifiers_and_inputs_take_classify(monkeypatch: pytest.MonkeyPatch) -> None:
    """A classifier that is not a built-in (a subclass too: it may classify otherwise)
    and layers that are not uint16 go through ``classify``; a bad layer is named in
    its words."""
    calls = []

    class Shifted(CombinedClassifier):
        def classify(
            self, layers: np.ndarray, magnitudes: np.ndarray, *, n_layers: int
        ) -> ChunkClasses:
            calls.append(n_layers)
            return ChunkClasses(np.full(len(layers), 3, np.uint8), np.ones(len(layers), bool),
                                magnitude_class(magnitudes))  # fmt: skip

    m = f32(1, 2, 3)
    out = classify.classify_chunks(Shifted(), np.zeros(3, np.uint16), m, n_layers=1)
    assert calls == [1] and out.prio.tolist() == [3, 3, 3] and out.drop.all()
    out = classify.classify_chunks(Shifted(), np.zeros(3, np.uint16), m, n_layers=1,
                                   may_drop=False)  # fmt: skip
    assert not out.drop.any() and out.prio.tolist() == [3, 3, 3]
    wide = classify.classify_chunks(CombinedClassifier(drop_fraction=0.5), np.array([0, 1, 1]),
                                    m, n_layers=2)  # fmt: skip
    assert wide.drop.tolist() == [True, False, False]
    with pytest.raises(ValueError, match=r"layer 4 outside 0\.\.3"):
        classify.classify_chunks(LayerClassifier(), np.array([0, 4], np.uint16), f32(1, 2),
                                 n_layers=4)  # fmt: skip


@pytest.mark.skipif(not kernels.ACCELERATED, reason="C accelerator not built")
def test_c_pass_checks_its_arguments() -> None:
    layers, m = np.zeros(4, np.uint16), f32(1, 2, 3, 4)
    table = np.zeros(1, np.uint8)
    with pytest.raises(ValueError, match="float32 threshold"):
        kernels.classify_chunks(layers, 1, m, table, None, -1.0, 0.1, True, 20, 15)
    with pytest.raises(ValueError, match="per-layer tables of 2"):
        kernels.classify_chunks(layers, 2, m, table, None, 0.5, 0.0, True, 20, 15)
    with pytest.raises(ValueError, match="4 chunks need"):
        kernels.classify_chunks(layers, 1, m[:3], table, None, 0.5, 0.0, True, 20, 15)
    assert kernels.classify_chunks(layers + 1, 1, m, table, None, 0.5, 0.0, True, 20, 15) is None
