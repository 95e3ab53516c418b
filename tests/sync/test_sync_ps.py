"""Parameter server with BSP, ASP and SSP (``dlcp.sync.ps``), on real endpoints in
threads: BSP matches a single-process reference (co-located and dedicated
servers, two shards); SSP reads hold exactly the updates their reported clocks
say, never fewer than every update up to ``c - s - 1`` and the reader's own,
under random per-worker delays; ASP never blocks on a stalled worker; a worker
that dies makes the others fail naming it; bounded-loss pushes report their loss."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

from dlcp.io import Endpoint
from dlcp.sync import WorkerFailed, make
from tests.sync.sync_helpers import each_rank, endpoints, loss_of, mlp, seeded

LR = 0.1


def _reference(world_workers: list[int], steps: int) -> list[torch.Tensor]:
    """One process: every step, the average of the workers' gradients."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for t in range(steps):
        opt.zero_grad()
        grads = []
        for w in world_workers:
            model.zero_grad()
            loss_of(model, w, t).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(g[i] for g in grads) / len(world_workers)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("world", "servers", "workers"),
    [(3, None, None), (3, [0], [1, 2]), (4, [2, 3], [0, 1])],
    ids=["co-located", "dedicated", "two-dedicated-shards"],
)
def test_bsp_matches_a_single_process_reference(
    world: int, servers: list[int] | None, workers: list[int] | None
) -> None:
    steps = 4
    wrk = workers if workers is not None else list(range(world))

    def rank(r: int, ep: Endpoint) -> Any:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        sync = make("bsp", model, opt, endpoint=ep, world_size=world, servers=servers,
                    workers=workers)  # fmt: skip
        if r not in wrk:
            sync.serve(timeout=30)
            return None
        reports = []
        for t in range(steps):
            opt.zero_grad()
            loss_of(model, r, t).backward()
            reports.append(sync.step())
        sync.close()
        return [p.detach().clone() for p in model.parameters()], reports

    with endpoints(world) as eps:
        results = each_rank(eps, rank)
    want = _reference(wrk, steps)
    for r in wrk:
        params, reports = results[r]
        for i, (got, ref) in enumerate(zip(params, want, strict=True)):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
            assert got.numpy().tobytes() == results[wrk[0]][0][i].numpy().tobytes()
        for t, rep in enumerate(reports, start=1):
            assert rep.clock == t and rep.staleness == 0
            assert rep.clocks == (t,) * len(wrk)
            assert rep.lost_elems == 0


def _slot_model(n_workers: int, steps: int) -> torch.nn.Module:
    """One parameter per worker, one element per iteration: worker w's update of
    iteration t sets element t of parameter w to 1 (the server adds update / N)."""
    return torch.nn.ParameterList(
        [torch.nn.Parameter(torch.zeros(steps)) for _ in range(n_workers)]
    )


def _slot_worker(
    sync: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, w: int, n: int, steps: int,
    delay: random.Random | None, stall: threading.Event | None = None,
    stepped: threading.Event | None = None,
) -> list[tuple[int, tuple[int, ...], list[np.ndarray]]]:
    """Run ``steps`` iterations; after each read, what the model holds."""
    reads = []
    for t in range(steps):
        if stall is not None and t == 1:
            assert stall.wait(30)
        if delay is not None:
            time.sleep(delay.uniform(0, 0.015))  # the iteration's compute time
        opt.zero_grad()
        for i, p in enumerate(model.parameters()):
            p.grad = torch.zeros_like(p)
            if i == w:
                p.grad[t] = -float(n)  # SGD, lr 1: the update adds n, the server n / n
        rep = sync.step()
        assert rep.staleness <= rep.clock - min(rep.clocks)  # (finished workers left out)
        held = [p.detach().numpy().copy() for p in model.parameters()]
        reads.append((rep.clock, rep.clocks, held))
    if stepped is not None:
        stepped.set()
    sync.close()
    return reads


@pytest.mark.parametrize(("seed", "servers"), [(1, [0]), (2, [0]), (3, [0]), (4, [1, 3])])
def test_ssp_reads_hold_what_their_clocks_say_and_the_spread_stays_within_s(
    seed: int, servers: list[int]
) -> None:
    n, steps, s = 4, 10, 2

    def rank(r: int, ep: Endpoint) -> Any:
        model = _slot_model(n, steps)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sync = make("ssp", model, opt, endpoint=ep, world_size=n, servers=servers,
                    workers=list(range(n)), staleness=s)  # fmt: skip
        return _slot_worker(sync, model, opt, r, n, steps, random.Random(seed * 10 + r))

    with endpoints(n) as eps:
        results = each_rank(eps, rank)
    spreads = []
    for w, reads in enumerate(results):
        for c, clocks, params in reads:
            assert c - min(clocks) <= s, (w, c, clocks)  # the spread never exceeds s
            assert clocks[w] >= c  # its own writes
            spreads.append(c - min(clocks))
            for v, p in enumerate(params):
                # the updates the clocks report (so every one up to c - s - 1) and, in
                # order, no later ones than its shard had; with one shard, exactly those
                held = int(p.sum())
                assert p.tolist() == [1.0] * held + [0.0] * (steps - held), (w, c, v, p)
                assert held >= clocks[v] and (held == clocks[v] or len(servers) > 1)
    assert max(spreads) > 0  # the delays made some reads stale (else SSP was not exercised)


def test_asp_never_blocks_on_a_stalled_worker() -> None:
    n, steps = 3, 8
    stall = threading.Event()
    done = [threading.Event() for _ in range(n)]

    def rank(r: int, ep: Endpoint) -> Any:
        model = _slot_model(n, steps)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sync = make("asp", model, opt, endpoint=ep, world_size=n, servers=[0],
                    workers=list(range(n)))  # fmt: skip
        return _slot_worker(sync, model, opt, r, n, steps, None, stall if r == 2 else None,
                            done[r])

    with endpoints(n) as eps:
        def release() -> None:  # only once ranks 0 and 1 have done every step
            if done[0].wait(8) and done[1].wait(8):
                stall.set()

        watcher = threading.Thread(target=release)
        watcher.start()
        results = each_rank(eps, rank)
        watcher.join()
    assert stall.is_set() and done[0].is_set() and done[1].is_set()
    # ranks 0 and 1 finished every step while rank 2 sat at clock 1
    for w in (0, 1):
        assert [c for c, _, _ in results[w]] == list(range(1, steps + 1))
        assert all(clocks[2] <= 1 for _, clocks, _ in results[w])
    assert results[2][-1][1] == (steps, steps, steps)


def test_a_dead_worker_makes_the_others_fail_naming_it() -> None:
    n = 4
    errors: dict[int, BaseException] = {}

    def rank(r: int, ep: Endpoint) -> Any:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        sync = make("ssp", model, opt, endpoint=ep, world_size=n, servers=[0],
                    workers=list(range(n)), staleness=1)  # fmt: skip
        started = time.monotonic()
        try:
            for t in range(50):
                if r == 3 and t == 2:
                    ep.close()  # dies without a word
                    return None
                opt.zero_grad()
                loss_of(model, r, t).backward()
                sync.step()
        except WorkerFailed as exc:
            errors[r] = exc
            assert time.monotonic() - started < 15
        sync.close()  # (after the failure: returns at once, sends nothing)
        return None

    with endpoints(n, timeout=5.0) as eps:
        each_rank(eps, rank, timeout=40)
    assert sorted(errors) == [0, 1, 2]
    for exc in errors.values():
        assert isinstance(exc, WorkerFailed) and exc.rank == 3
        assert "rank 3" in str(exc)


def test_bounded_loss_pushes_report_their_loss() -> None:
    n, steps = 3, 3

    def rank(r: int, ep: Endpoint) -> Any:
        model = seeded(0, lambda: torch.nn.Sequential(torch.nn.Linear(300, 200),
                                                      torch.nn.Linear(200, 10)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sync = make("bsp", model, opt, endpoint=ep, world_size=n, p=0.1)
        reports = []
        for t in range(steps):
            opt.zero_grad()
            x = torch.randn(4, 300, generator=torch.Generator().manual_seed(t + r))
            model(x).sum().backward()
            reports.append(sync.step())
        sync.close()
        return reports, [p.detach().numpy().copy() for p in model.parameters()]

    with endpoints(n, emulated_loss=0.05) as eps:
        results = each_rank(eps, rank)
    lost = 0
    for reports, params in results:
        for rep in reports:
            assert rep.lost_fraction <= 0.1
            assert rep.bounded_elems > 0
            lost += rep.lost_elems
            assert sum(rep.lost_chunks) <= sum(rep.class_chunks)
        for a, b in zip(params, results[0][1], strict=True):  # exact pulls: one model
            assert a.tobytes() == b.tobytes()
    assert lost > 0


def test_allreduce_baseline_matches_the_same_reference() -> None:
    world, steps = 3, 4

    def rank(r: int, ep: Endpoint) -> Any:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        sync = make("allreduce", model, opt, endpoint=ep, world_size=world)
        for t in range(steps):
            opt.zero_grad()
            loss_of(model, r, t).backward()
            sync.step()
        sync.close()
        return [p.detach().clone() for p in model.parameters()]

    with endpoints(world) as eps:
        results = each_rank(eps, rank)
    for params in results:
        for got, ref, first in zip(params, _reference(list(range(world)), steps), results[0],
                                   strict=True):  # fmt: skip
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
            assert got.numpy().tobytes() == first.numpy().tobytes()


def test_a_finished_worker_no_longer_counts_in_the_staleness() -> None:
    n = 3

    def rank(r: int, ep: Endpoint) -> Any:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        sync = make("ssp", model, opt, endpoint=ep, world_size=n, servers=[0],
                    workers=[0, 1, 2], staleness=1)  # fmt: skip
        reports = []
        for t in range(2 if r == 2 else 8):  # rank 2 stops early, rank 0 and 1 go on
            opt.zero_grad()
            loss_of(model, r, t).backward()
            reports.append(sync.step())
        sync.close()
        return reports

    with endpoints(n) as eps:
        results = each_rank(eps, rank)
    for reports in results[:2]:
        assert all(rep.staleness <= 1 for rep in reports), [r.staleness for r in reports]
        assert reports[-1].clocks[2] == 2  # (its clock stays in what is read)
