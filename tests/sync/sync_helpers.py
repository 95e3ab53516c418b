"""Several DLCP endpoints on loopback in this process, one thread per rank, for
the synchronisation-scheme tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import torch

from dlcp.io import Endpoint, EndpointConfig
from tests.io.endpoint_helpers import JOB, LocalStore, dlcp_threads


@contextlib.contextmanager
def endpoints(world: int, *, timeout: float = 10.0, **config: Any) -> Iterator[list[Endpoint]]:
    store = LocalStore()
    eps: list[Endpoint] = []
    try:
        for rank in range(world):
            cfg = EndpointConfig(timeout=timeout, emulated_loss_seed=rank, **config)
            eps.append(Endpoint(rank, store=store, world_size=world, job=JOB, config=cfg))
        yield eps
    finally:
        for ep in eps:
            ep.close()
    leftover = [n for n in dlcp_threads() if not n.startswith("dlcp-ps")]
    assert leftover == [], f"dlcp threads left after close(): {leftover}"


def each_rank(
    eps: list[Endpoint], fn: Callable[[int, Endpoint], Any], *, timeout: float = 60.0
) -> list[Any]:
    """``fn(rank, endpoint)`` in one thread per rank; the results in rank order
    (the first exception is raised after every thread has ended). A thread still
    running after ``timeout`` seconds fails the test instead of hanging it."""
    pool = ThreadPoolExecutor(len(eps), thread_name_prefix="rank")
    futs: list[Future[Any]] = [pool.submit(fn, r, ep) for r, ep in enumerate(eps)]
    try:
        wait(futs, timeout=timeout)
        stuck = [r for r, f in enumerate(futs) if not f.done()]
        assert not stuck, f"rank(s) {stuck} still running after {timeout} s (a hang)"
        return [f.result() for f in futs]
    finally:
        pool.shutdown(wait=False)


_INIT = threading.Lock()  # torch's global generator: one rank's thread at a time


def seeded(seed: int, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``build()`` with the global generator seeded: the same model on every rank."""
    with _INIT, torch.random.fork_rng():
        torch.manual_seed(seed)
        return build()


def mlp(seed: int = 0) -> torch.nn.Module:
    return seeded(seed, lambda: torch.nn.Sequential(
        torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)))


def batch(rank: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + t)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def loss_of(model: torch.nn.Module, rank: int, t: int) -> torch.Tensor:
    x, y = batch(rank, t)
    return torch.nn.functional.cross_entropy(model(x), y)
