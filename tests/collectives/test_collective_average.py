"""Averaging float16 divides before it sums, as torch's default DDP hook does.

Four ranks (endpoints on loopback, threads of this process) average float16
arrays of values near 40,000: summed first, two ranks' values already pass
float16's largest finite value (65,504) and the average came out ``inf``
(a review's reproducer, through the process group). Every collective that
averages must give the finite mean, with identical bytes on every rank.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from dlcp.collectives import (
    Communicator,
    direct_allreduce,
    halving_doubling_allreduce,
    ps_allreduce,
    ps_serve,
    ring_allreduce,
)
from tests.collectives.test_ps_dedicated import endpoints

pytestmark = pytest.mark.integration

WORLD = 4
N = 30_001


def values(rank: int) -> npt.NDArray[np.float16]:
    return (40_000 + 8 * rank + np.arange(N) % 64).astype(np.float16)


COLLECTIVES: dict[str, Callable[..., Any]] = {
    "ring": functools.partial(ring_allreduce, p=0.0),
    "ring-bounded": functools.partial(ring_allreduce, p=0.05),
    "direct": direct_allreduce,
    "halving-doubling": halving_doubling_allreduce,
    "ps-colocated": functools.partial(ps_allreduce, servers=[0, 1]),
}


@pytest.mark.parametrize("name", [*COLLECTIVES, "ps-dedicated"])
def test_float16_average_does_not_overflow(name: str) -> None:
    workers = [1, 2, 3] if name == "ps-dedicated" else list(range(WORLD))
    expected = (sum(values(r).astype(np.float64) for r in workers) / len(workers)).astype(
        np.float16
    )

    def rank_main(eps: list[Any], rank: int) -> npt.NDArray[np.float16] | None:
        comm = Communicator(eps[rank], WORLD)
        if name == "ps-dedicated" and rank == 0:
            ps_serve(comm, servers=[0], workers=workers, average=True)
            return None
        data = values(rank)
        if name == "ps-dedicated":
            ps_allreduce(comm, data, servers=[0], workers=workers, average=True)
        else:
            COLLECTIVES[name](comm, data, average=True)
        return data

    with endpoints(WORLD) as eps, ThreadPoolExecutor(WORLD) as pool:
        results = list(pool.map(functools.partial(rank_main, eps), range(WORLD)))
    got = [r for r in results if r is not None]
    assert all(np.isfinite(g).all() for g in got), "the float16 average overflowed"
    assert all(g.tobytes() == got[0].tobytes() for g in got)  # identical replicas
    # within float16's rounding of each term (one ulp at 40,000 is 32)
    np.testing.assert_allclose(got[0].astype(np.float64), expected.astype(np.float64), atol=64)

