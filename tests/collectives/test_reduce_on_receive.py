"""A co-located parameter server receives float32 pushes with a zero fill straight
into its shard (``Endpoint.recv(accumulate=True)``), with real endpoints in this
process: it adds pushes in arrival order, so its sums match the reference to
rounding and every worker pulls the same bytes. The ring receives its
reduce-scatter into scratch and adds it afterwards (adding on receive cost it 1-2 %
of its CPU: docs/results/2026-11-30/reduce_on_receive/): every element has the
bits of the reference that adds in the ring's order, for float32 and float16 and
with the rescale fill, and under emulated loss a lost element adds nothing and the
loss stays within the bound."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dlcp.collectives import ps_allreduce, ring_allreduce
from dlcp.collectives.ring import chunk_bounds
from dlcp.proto.config import FillPolicy
from tests.collectives.test_halving import _run, ranks

pytestmark = pytest.mark.integration

WORLD = 4


def _arrays(n: int, seed: int, dtype: Any = np.float32) -> list[np.ndarray]:
    return [
        np.random.default_rng(seed + r).standard_normal(n).astype(dtype) for r in range(WORLD)
    ]


def _ring_order_sum(arrays: list[np.ndarray]) -> np.ndarray:
    """Each chunk ``c`` summed as the ring sums it: starting at rank ``c``, every
    next rank adding its own values to what it received."""
    n = len(arrays[0])
    bounds = chunk_bounds(n, WORLD)
    want = np.empty_like(arrays[0])
    for c in range(WORLD):
        a, b = bounds[c], bounds[c + 1]
        total = arrays[c][a:b].copy()
        for k in range(1, WORLD):
            total = arrays[(c + k) % WORLD][a:b] + total
        want[a:b] = total
    return want


@pytest.mark.parametrize("n", [3, 1000, 123_457])
def test_the_ring_adds_in_its_order(n: int) -> None:
    with ranks(WORLD) as comms:
        arrays = _arrays(n, 40)
        want = _ring_order_sum(arrays)
        reports = _run(comms, arrays, op=ring_allreduce, p=0.0)
    for a in arrays:
        assert a.tobytes() == want.tobytes()
    assert all(r.lost_elems == 0 for r in reports)


@pytest.mark.parametrize(("dtype", "fill"), [(np.float16, FillPolicy.ZERO),
                                             (np.float32, FillPolicy.RESCALE)])  # fmt: skip
def test_what_cannot_be_added_on_receive_still_sums(dtype: Any, fill: FillPolicy) -> None:
    with ranks(WORLD) as comms:
        arrays = _arrays(10_000, 50, dtype)
        want = _ring_order_sum(arrays)
        _run(comms, arrays, op=ring_allreduce, p=0.0, fill=fill)
    for a in arrays:
        assert a.tobytes() == want.tobytes()


def test_the_ring_under_loss_adds_nothing_for_what_it_lost() -> None:
    with ranks(WORLD, emulated_loss=0.05) as comms:
        arrays = _arrays(60_000, 60)
        exact = sum(a.astype(np.float64) for a in arrays)
        reports = _run(comms, arrays, op=ring_allreduce, p=0.05)
    for a in arrays[1:]:
        assert a.tobytes() == arrays[0].tobytes()  # exact all-gather
    lost = sum(r.lost_elems for r in reports)
    assert lost > 0 and all(r.lost_fraction <= 0.05 for r in reports)
    # an element that lost a partial sum holds fewer ranks' values, not garbage
    wrong = ~np.isclose(arrays[0], exact, rtol=1e-4, atol=1e-4)
    assert 0 < wrong.sum() <= lost
    assert np.abs(arrays[0]).max() < 8 * np.abs(exact).max()


def test_a_colocated_server_adds_pushes_as_they_arrive() -> None:
    with ranks(WORLD) as comms:
        for call in range(3):
            arrays = _arrays(50_001, 70 + call)
            exact = sum(a.astype(np.float64) for a in arrays)
            reports = _run(comms, arrays, op=ps_allreduce)
            for a in arrays:
                assert a.tobytes() == arrays[0].tobytes()  # every worker pulled the same
            np.testing.assert_allclose(arrays[0], exact, rtol=1e-5, atol=1e-5)
            assert all(r.lost_elems == 0 for r in reports)
