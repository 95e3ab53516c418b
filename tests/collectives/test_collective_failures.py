"""How collectives fail: with the endpoint's own reason, and without putting
the ranks' call numbers out of step. Ranks are endpoints on loopback in
threads of this process (an in-process store)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from dlcp.collectives import Communicator, ps_allreduce, ps_serve, ring_allreduce
from dlcp.errors import PeerTimeout, TransferFailed
from dlcp.io import Endpoint, EndpointConfig
from tests.io.endpoint_helpers import JOB, LocalStore, dlcp_threads

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def communicators(world: int, timeout: float) -> Iterator[list[Communicator]]:
    store = LocalStore()
    cfg = EndpointConfig(timeout=timeout)
    eps = [Endpoint(r, store=store, world_size=world, job=JOB, config=cfg) for r in range(world)]
    try:
        yield [Communicator(ep, world) for ep in eps]
    finally:
        for ep in eps:
            ep.close()
    assert dlcp_threads() == []


def _each(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run the calls in threads at once; each one's result, or what it raised."""

    def run(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_a_collectives_timeout_keeps_the_endpoints_reason() -> None:
    """PeerTimeout is a TimeoutError, and so concurrent.futures' TimeoutError:
    Communicator.wait took the endpoint's own timeout for its backstop's and
    replaced it with a message naming a time that never passed (endpoint
    timeout + 5 s, raised after the endpoint timeout; a review's reproducer)."""
    with communicators(3, timeout=1.0) as comms:  # (rank 2 never joins the call)
        errors = _each([lambda c=c: ring_allreduce(c, np.ones(3000, np.float32))
                        for c in comms[:2]])  # fmt: skip
    for exc in errors:
        assert isinstance(exc, PeerTimeout | TransferFailed), errors
        assert "Communicator timeout" not in str(exc), exc
    assert any("did not complete within 1 s" in str(e) for e in errors), errors


def test_a_ps_call_the_workers_refuse_keeps_the_dedicated_server_in_step() -> None:
    """Workers refuse a call that would leave a dedicated server an empty shard;
    the server cannot see that and took its call number, the workers did not:
    every later call met the wrong messages and timed out (a review's
    reproducer). A refused call now takes its number like any other."""
    servers, workers = [2, 0], [0, 1]  # rank 2 serves only; its shard comes first
    with communicators(3, timeout=1.0) as comms:

        def step(n: int) -> list[Any]:
            data = [np.full(n, float(r + 1), np.float32) for r in range(3)]
            calls: list[Callable[[], Any]] = [
                lambda r=r: ps_allreduce(comms[r], data[r], servers=servers, workers=workers)
                for r in workers
            ]
            calls.append(lambda: ps_serve(comms[2], servers=servers, workers=workers))
            results = _each(calls)
            return [*results, data]

        refused = step(1)  # one element for two servers: rank 2's shard is empty
        assert all(isinstance(e, ValueError) and "empty shard" in str(e) for e in refused[:2])
        assert isinstance(refused[2], PeerTimeout | TransferFailed)  # (the server waited)
        *results, data = step(100)
        assert not any(isinstance(x, Exception) for x in results), results
        assert all(np.array_equal(data[r], np.full(100, 3.0, np.float32)) for r in workers)
