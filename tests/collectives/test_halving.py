"""Halving-doubling all-reduce (``dlcp.collectives.halving``), with real endpoints
in this process: the splits give every element one owner; exact sums for sizes
down to fewer elements than ranks; under emulated loss (p = 0.05) every replica
ends with the same bytes and the loss stays within the bound; a world that is
not a power of two, or a gather bound above ``p``, is refused. With a gather
bound above 0, a lost all-gather element keeps this rank's estimate (ring and
halving-doubling alike); a previous-value fill of the reduce phase is refused."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from dlcp.collectives import (
    CollectiveReport,
    Communicator,
    halving_doubling_allreduce,
    ps_allreduce,
    ring_allreduce,
)
from dlcp.collectives.halving import _splits, is_power_of_two
from dlcp.io import Endpoint, EndpointConfig
from dlcp.proto.config import FillPolicy
from tests.io.endpoint_helpers import JOB, LocalStore, dlcp_threads

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 3, 7, 100, 9571])
def test_splits_give_every_element_one_owner_and_pairs_agree(world: int, n: int) -> None:
    plans = {r: _splits(n, world, r) for r in range(world)}
    owner = np.zeros(n, dtype=np.int64)
    for r, steps in plans.items():
        assert len(steps) == world.bit_length() - 1  # log2(world) steps
        for partner, lo, mid, hi, upper in steps:
            # the partner splits the same range at the same place, keeping the other half
            mine = (lo, mid, hi)
            theirs = next(s for s in plans[partner] if s[0] == r)
            assert theirs[1:4] == mine and theirs[4] is not upper
        _, lo, mid, hi, upper = steps[-1]
        a, b = (mid, hi) if upper else (lo, mid)
        owner[a:b] += 1
    assert (owner == 1).all()
    assert is_power_of_two(world) and not is_power_of_two(world + 1 if world > 2 else 3)


@contextlib.contextmanager
def ranks(world: int, **config: Any) -> Iterator[list[Communicator]]:
    store = LocalStore()
    eps: list[Endpoint] = []
    try:
        for rank in range(world):
            cfg = EndpointConfig(timeout=10, emulated_loss_seed=rank, **config)
            eps.append(Endpoint(rank, store=store, world_size=world, job=JOB, config=cfg))
        yield [Communicator(ep, world) for ep in eps]
    finally:
        for ep in eps:
            ep.close()
    assert dlcp_threads() == [], "dlcp threads left after close()"


def _run(
    comms: list[Communicator], arrays: list[np.ndarray], op: Any = halving_doubling_allreduce,
    **kw: Any,
) -> list[CollectiveReport]:
    with ThreadPoolExecutor(len(comms)) as pool:
        futs = [pool.submit(op, c, a, **kw) for c, a in zip(comms, arrays, strict=True)]
        return [f.result(timeout=60) for f in futs]


def test_exact_sums_for_every_size() -> None:
    with ranks(4) as comms:
        for n in (0, 1, 3, 4, 5, 17, 1000, 40_000):
            arrays = [
                np.random.default_rng(100 * n + r).standard_normal(n).astype(np.float32)
                for r in range(4)
            ]
            # every rank adds in the same order as this reference: pairs first
            want = (arrays[0] + arrays[2]) + (arrays[1] + arrays[3])
            reports = _run(comms, arrays, p=0.0)
            for a in arrays:
                np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6)
                assert a.tobytes() == arrays[0].tobytes()  # identical replicas
            assert all(r.lost_elems == 0 and r.op == "halving_doubling_allreduce"
                       for r in reports)  # fmt: skip
        # the average, in place
        arrays = [np.full(10, float(r + 1), dtype=np.float32) for r in range(4)]
        _run(comms, arrays, average=True)
        for a in arrays:
            np.testing.assert_array_equal(a, np.full(10, 2.5, dtype=np.float32))


def test_bounded_loss_keeps_replicas_identical() -> None:
    with ranks(4, emulated_loss=0.05) as comms:
        lost = 0
        for call in range(5):
            arrays = [
                np.random.default_rng(10 * call + r).standard_normal(50_000).astype(np.float32)
                for r in range(4)
            ]
            reports = _run(comms, arrays, p=0.05)
            for a in arrays[1:]:
                assert a.tobytes() == arrays[0].tobytes()  # exact all-gather
            for r in reports:
                assert r.lost_fraction <= 0.05, r
                lost += r.lost_elems
        assert lost > 0  # the emulator dropped reduce-scatter data, within the bound


def test_refuses_a_world_that_is_not_a_power_of_two_and_a_loose_gather() -> None:
    zeros = np.zeros(8, np.float32)
    with ranks(3) as comms, pytest.raises(ValueError, match="power-of-two world, got 3"):
        halving_doubling_allreduce(comms[0], zeros)
    with ranks(2) as comms, pytest.raises(ValueError, match=r"p_gather=0\.1 must not exceed"):
        halving_doubling_allreduce(comms[0], zeros, p=0.05, p_gather=0.1)


@pytest.mark.parametrize("op", [ring_allreduce, halving_doubling_allreduce])
def test_a_lossy_gather_keeps_this_ranks_estimate(op: Any) -> None:
    """Every rank holds the same values x, so the average is x, and so is every
    rank's estimate from the partial sums it holds (their mean). A lost
    reduce-scatter element is zero-filled (a contribution short: below |x|); a lost
    all-gather element keeps the estimate (x). Keeping the partial sum itself, as
    before, put values up to 3x there."""
    x = np.random.default_rng(5).uniform(1.0, 2.0, 60_000).astype(np.float32)
    with ranks(4, emulated_loss=0.05) as comms:
        lost = 0
        for _ in range(4):
            arrays = [x.copy() for _ in range(4)]
            reports = _run(comms, arrays, op, p=0.05, p_gather=0.05, average=True)
            for a in arrays:
                assert (a <= x * (1 + 1e-6)).all(), float((a / x).max())
            lost += sum(r.lost_elems for r in reports)
        assert lost > 0


def test_the_reduce_phase_refuses_a_previous_value_fill() -> None:
    zeros = np.zeros(8, np.float32)
    with ranks(2) as comms:
        for op, kw in ((ring_allreduce, {"p": 0.05}), (halving_doubling_allreduce, {"p": 0.05}),
                       (ps_allreduce, {"p_push": 0.05})):  # fmt: skip
            with pytest.raises(ValueError, match="fill='previous' cannot fill the reduce"):
                op(comms[0], zeros, fill=FillPolicy.PREVIOUS, **kw)


def test_communicator_refuses_what_its_collectives_cannot_serve() -> None:
    from dlcp.errors import ConfigError

    with ranks(2) as comms:
        ep = comms[1].endpoint
        with pytest.raises(ConfigError, match=r"world_size=2049 outside 1\.\.2048"):
            Communicator(ep, 2049)
        with pytest.raises(ConfigError, match=r"rank 1 is not in 0\.\.0"):
            Communicator(ep, 1)
        with pytest.raises(ConfigError, match="timeout=0 must be a finite number"):
            Communicator(ep, 2, timeout=0)


@pytest.mark.parametrize("direct_max_bytes", [0, 1 << 20])  # the ring; one round
def test_an_empty_array_returns_at_once(direct_max_bytes: int) -> None:
    """Nothing to move: no message (one of 0 elements is refused) and no wait for
    the timeout (10 s here), as Gloo returns at once."""
    from dlcp.collectives import allreduce

    with ranks(3) as comms:
        arrays = [np.zeros(0, np.float32) for _ in range(3)]
        t0 = time.monotonic()
        reports = _run(comms, arrays, allreduce, direct_max_bytes=direct_max_bytes)
        assert time.monotonic() - t0 < 2.0
        assert all(r.elems == 0 and r.bytes_sent == 0 for r in reports)
