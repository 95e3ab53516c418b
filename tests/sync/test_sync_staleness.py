"""Staleness-aware learning rates (``dlcp.sync.lr``, ``eager``, ``vsgd``): the factor
functions are monotone and give 1 to a uniformly stale cluster; the eager-pull
worker's push overlaps its next computation (trace); a straggler's stale
updates are damped; VSGD runs SSP with value-staleness factors."""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import pytest
import torch

from dlcp.errors import ConfigError
from dlcp.io import Endpoint
from dlcp.sync import make
from dlcp.sync.clocks import ClockTable
from dlcp.sync.eager import StalenessRule
from dlcp.sync.lr import RunningMean, normalised_factor, staleness_rounds, value_staleness
from dlcp.sync.vsgd import ValueStalenessRule
from tests.sync.sync_helpers import each_rank, endpoints, loss_of, mlp, seeded

GRID = [0.0, 0.1, 0.5, 1.0, 2.0, 3.0, 7.5, 20.0, 100.0]


def test_the_factor_is_monotone_clipped_and_one_at_the_usual_staleness() -> None:
    for mean in GRID:
        f = [normalised_factor(x, mean) for x in GRID]
        assert all(a >= b for a, b in itertools.pairwise(f))  # non-increasing in x
        assert normalised_factor(mean, mean) == 1.0
        assert all(0.1 <= v <= 2.0 for v in f)
    for x in GRID:
        g = [normalised_factor(x, mean) for mean in GRID]
        assert all(a <= b for a, b in itertools.pairwise(g))  # non-decreasing in the mean
    assert normalised_factor(100.0, 0.0) == 0.1 and normalised_factor(0.0, 100.0) == 2.0
    with pytest.raises(ValueError, match="must be >= 0"):
        normalised_factor(-1.0, 0.0)


def test_staleness_measures() -> None:
    assert staleness_rounds(12, 4, 4) == 2.0 and staleness_rounds(4, 4, 4) == 0.0
    with pytest.raises(ValueError, match="older"):
        staleness_rounds(3, 4, 2)
    d = [value_staleness(x, 0.5) for x in GRID]
    assert d[0] == 0.0 and all(a <= b for a, b in itertools.pairwise(d))
    assert value_staleness(1.0, 0.0) == 1.0  # no step seen yet
    m = RunningMean(weight=0.5)
    assert m.add(4.0) == 4.0 and m.add(2.0) == 3.0


def test_a_uniformly_stale_cluster_is_not_slowed_down() -> None:
    rule = StalenessRule(4, min_factor=0.1, max_factor=2.0)
    table = ClockTable((0, 1, 2, 3), staleness=None)
    shard = np.zeros(3, np.float32)
    scales = []
    for version in range(8, 200, 4):  # every update 2 rounds stale
        table.applied[0] = version  # (version = sum of the applied counts)
        for w in (1, 2, 3):
            table.applied[w] = 0
        scales.append(rule.scale(0, 0, (version - 8, None), table, shard, shard))
    assert scales == [0.25] * len(scales)  # factor 1, over 4 workers
    table.applied[0] += 40
    assert rule.scale(0, 0, (table.version - 40, None), table, shard, shard) < 0.25  # staler


def test_value_staleness_damps_an_update_whose_start_moved_far() -> None:
    rule = ValueStalenessRule(2, min_factor=0.1, max_factor=2.0)
    table = ClockTable((0, 1), staleness=2)
    shard = np.ones(4, np.float32)
    step = np.full(4, 0.1, np.float32)
    near = rule.scale(0, 0, (0, shard.copy()), table, shard, step)  # nothing moved
    far = rule.scale(1, 0, (0, shard - 5.0), table, shard, step)
    assert near == 0.5 and far < near and rule.history[-1][2] > 0
    with pytest.raises(ConfigError, match="need 0 < min <= 1 <= max"):
        make("vsgd", mlp(), torch.optim.SGD(mlp().parameters(), lr=0.1), endpoint=None,
             world_size=2, min_factor=0.0)  # fmt: skip


def _big() -> torch.nn.Module:
    return seeded(1, lambda: torch.nn.Sequential(torch.nn.Linear(6, 3), torch.nn.Linear(3, 3),
                                                 torch.nn.Linear(3, 400_000, bias=False)))


def test_eager_pull_overlaps_the_push_with_the_next_computation() -> None:
    world, steps = 3, 5

    def rank(r: int, ep: Endpoint) -> Any:
        model = _big()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sync = make("eager", model, opt, endpoint=ep, world_size=world, servers=[0])
        if r == 0:
            sync.serve(timeout=60)
            return None
        for _ in range(steps):
            opt.zero_grad()
            x = torch.randn(2, 6, generator=torch.Generator().manual_seed(r))
            model(x).sum().backward()
            sync.step()
            time.sleep(0.02)  # the next iteration's compute
        sync.close()
        return sync.trace  # type: ignore[attr-defined]

    with endpoints(world) as eps:
        traces = each_rank(eps, rank)
    overlapped = 0
    for trace in traces[1:]:
        returned = {c: t for e, c, t in trace if e == "returned"}
        pushed = {c: t for e, c, t in trace if e == "pushed"}
        assert sorted(pushed) == list(range(steps))
        overlapped += sum(pushed[c] > returned[c] for c in range(steps))
    assert overlapped > 0  # a push still arriving while the next computation ran


def test_eager_pull_damps_a_stragglers_updates_and_trains() -> None:
    world, steps = 4, 12

    def rank(r: int, ep: Endpoint) -> Any:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sync = make("eager", model, opt, endpoint=ep, world_size=world, servers=[0])
        if r == 0:
            sync.serve(timeout=60)
            return sync.server.rule.history  # type: ignore[attr-defined]
        n = steps // 3 if r == 3 else steps
        losses = []
        for t in range(n):
            opt.zero_grad()
            loss = loss_of(model, r, t % 3)
            loss.backward()
            losses.append(loss.item())
            sync.step()
            time.sleep(0.03 if r == 3 else 0.01)  # rank 3 computes 3x slower
        sync.close()
        return losses

    with endpoints(world) as eps:
        results = each_rank(eps, rank)
    history = results[0]
    by_worker = {w: [f for ww, _, _, f in history if ww == w] for w in (1, 2, 3)}
    taus = {w: np.mean([tau for ww, _, tau, _ in history if ww == w]) for w in (1, 2, 3)}
    assert taus[3] > max(taus[1], taus[2])  # the straggler's updates are staler
    assert np.mean(by_worker[3]) < min(np.mean(by_worker[1]), np.mean(by_worker[2]))
    assert all(0.1 <= f <= 2.0 for fs in by_worker.values() for f in fs)


def test_vsgd_keeps_the_ssp_bound_and_scales_by_value_staleness() -> None:
    world, steps, s = 3, 8, 1

    def rank(r: int, ep: Endpoint) -> Any:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.2)
        sync = make("vsgd", model, opt, endpoint=ep, world_size=world, staleness=s, servers=[0],
                    workers=[0, 1, 2])  # fmt: skip
        reports = []
        for t in range(steps):
            opt.zero_grad()
            loss_of(model, r, t).backward()
            time.sleep(0.002 * (r + 1) * (t % 3))
            reports.append(sync.step())
        sync.close()  # (a co-located server has applied every update when this returns)
        history = sync.server.rule.history if r == 0 else None  # type: ignore[attr-defined]
        return reports, history

    with endpoints(world) as eps:
        results = each_rank(eps, rank)
    for reports, _ in results:
        assert all(rep.staleness <= s and rep.scheme == "vsgd" for rep in reports)
    history = results[0][1]
    assert len(history) == world * steps
    assert all(nu >= 0 and 0.1 <= f <= 2.0 for _, _, nu, f in history)
    assert any(nu > 0 for _, _, nu, _ in history)
