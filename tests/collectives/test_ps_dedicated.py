"""Parameter server with dedicated server ranks (``ps_serve``), in one process.

Every rank is a :class:`dlcp.io.Endpoint` on loopback in a thread of this
process, found through an in-process store:

* p = 0: 1 dedicated server + 3 workers (sum) and 2 dedicated servers + 3
  workers (average, server ranks not first): every worker ends with the exact
  aggregate of the workers' arrays, and the workers hold identical bytes;
* emulated loss (2 % of received datagrams) with push bound p = 0.05 and an
  exact pull: the workers still hold identical bytes, the servers report a
  lost fraction in (0, 0.05], and the result differs from the exact sum only
  in as many elements as the servers report lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from dlcp.collectives import CollectiveReport, Communicator, ps_allreduce, ps_serve
from dlcp.io import Endpoint, EndpointConfig
from tests.io.endpoint_helpers import JOB, LocalStore, dlcp_threads

pytestmark = pytest.mark.integration

N = 100_003  # not a multiple of the number of servers: shards of unequal length
TIMEOUT = 10.0


@contextlib.contextmanager
def endpoints(world: int, **config: Any) -> Iterator[list[Endpoint]]:
    """``world`` endpoints on loopback, found through one in-process store."""
    store = LocalStore()
    eps: list[Endpoint] = []
    try:
        for rank in range(world):
            cfg = {k: (v(rank) if callable(v) else v) for k, v in config.items()}
            eps.append(
                Endpoint(
                    rank,
                    store=store,
                    world_size=world,
                    job=JOB,
                    config=EndpointConfig(timeout=TIMEOUT, **cfg),
                )
            )
        yield eps
    finally:
        for ep in eps:
            ep.close()
    assert dlcp_threads() == [], "dlcp threads left after close()"


def worker_data(rank: int) -> npt.NDArray[np.float32]:
    return np.random.default_rng(100 + rank).standard_normal(N).astype(np.float32)


def run_steps(
    eps: list[Endpoint],
    *,
    servers: list[int],
    workers: list[int],
    steps: int = 1,
    **kwargs: Any,
) -> tuple[dict[int, list[npt.NDArray[np.float32]]], dict[int, list[CollectiveReport]]]:
    """Every rank in a thread of its own makes ``steps`` PS calls; returns each
    worker's array after every step and every rank's reports."""
    world = len(eps)

    def rank_main(rank: int) -> tuple[list[npt.NDArray[np.float32]], list[CollectiveReport]]:
        comm = Communicator(eps[rank], world)
        arrays, reports = [], []
        for _ in range(steps):
            if rank in workers:
                data = worker_data(rank)
                reports.append(ps_allreduce(comm, data, servers=servers, workers=workers, **kwargs))
                arrays.append(data)
            else:
                reports.append(ps_serve(comm, servers=servers, workers=workers, **kwargs))
        return arrays, reports

    with ThreadPoolExecutor(world, thread_name_prefix="ps-rank") as pool:
        futs = [pool.submit(rank_main, r) for r in range(world)]
        done = [f.result(timeout=steps * (TIMEOUT + 10)) for f in futs]
    return {r: done[r][0] for r in workers}, {r: done[r][1] for r in range(world)}


def exact_sum(workers: list[int]) -> npt.NDArray[np.float64]:
    return np.sum([worker_data(w).astype(np.float64) for w in workers], axis=0)


def assert_identical(arrays: list[npt.NDArray[np.float32]]) -> None:
    first = arrays[0]
    for other in arrays[1:]:
        assert other.dtype == first.dtype and other.shape == first.shape
        assert other.tobytes() == first.tobytes(), "workers hold different bytes"


@pytest.mark.parametrize(
    ("world", "servers", "workers", "average"),
    [
        (4, [0], [1, 2, 3], False),
        (5, [1, 3], [0, 2, 4], True),
    ],
    ids=["1-server-sum", "2-servers-average"],
)
def test_dedicated_servers_exact(
    world: int, servers: list[int], workers: list[int], average: bool
) -> None:
    with endpoints(world) as eps:
        arrays, reports = run_steps(eps, servers=servers, workers=workers, steps=2, average=average)
    want = exact_sum(workers) / (len(workers) if average else 1)
    for step in range(2):
        results = [arrays[w][step] for w in workers]
        assert_identical(results)
        np.testing.assert_allclose(results[0].astype(np.float64), want, rtol=1e-5, atol=1e-5)
        # a worker's inputs differ from the aggregate: nothing was left in place
        assert not np.array_equal(results[0], worker_data(workers[0]))
    for r in range(world):
        for step, rep in enumerate(reports[r]):
            assert rep.call == step
            assert rep.lost_elems == 0 and rep.lost_fraction == 0.0
            if r in servers:
                assert rep.op == "ps_serve"
                # a server receives its shard from every worker and sends it back to each
                assert rep.bytes_received == rep.bytes_sent == rep.elems * 4 * len(workers)
            else:
                assert rep.op == "ps_allreduce"
                assert rep.elems == N
                assert rep.bytes_sent == rep.bytes_received == N * 4
    # the servers' shards cover the array once
    assert sum(reports[s][0].elems for s in servers) == N


def test_dedicated_server_push_bound_under_emulated_loss() -> None:
    servers, workers, p = [0], [1, 2, 3], 0.05
    with endpoints(4, emulated_loss=0.02, emulated_loss_seed=lambda rank: rank) as eps:
        arrays, reports = run_steps(
            eps, servers=servers, workers=workers, steps=2, p_push=p, p_pull=0.0
        )
    want = exact_sum(workers)
    for step in range(2):
        results = [arrays[w][step] for w in workers]
        assert_identical(results)  # the pull is exact: every replica the same bytes
        server = reports[0][step]
        assert server.op == "ps_serve"
        assert 0.0 < server.lost_fraction <= p, server
        assert server.lost_elems > 0
        # lost pushes are zero-filled at the server: the result is off only there
        off = ~np.isclose(results[0].astype(np.float64), want, rtol=1e-5, atol=1e-5)
        assert 0 < int(off.sum()) <= server.lost_elems
        for w in workers:  # nothing of the exact pull is missing on a worker
            assert reports[w][step].lost_elems == 0


def test_an_empty_shard_for_a_dedicated_server_is_refused_up_front() -> None:
    # 1 element, 2 dedicated servers: server 0 would wait for pushes that never come
    with endpoints(3) as eps:
        comm = Communicator(eps[2], 3)
        with pytest.raises(ValueError, match=r"dedicated server\(s\) \[0\] an empty shard"):
            ps_allreduce(comm, np.ones(1, np.float32), servers=[0, 1], workers=[2])
