"""P-Reduce, DS-Sync and Ripples on real endpoints in threads: a group's members
end with identical bytes and the group's sum (p = 0); under emulated loss they
still agree and the loss stays within the bound; DS-Sync takes constant
parameters to the exact global mean in the rounds its schedule implies; Ripples
with a slow worker and random delays finishes (its Group Buffers never
deadlock); a member that dies is named to the one waiting for it."""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
import pytest
import torch

from dlcp.io import Endpoint
from dlcp.sync import WorkerFailed, make
from dlcp.sync.groups import GroupGenerator
from dlcp.sync.preduce import preduce
from tests.sync.sync_helpers import each_rank, endpoints, loss_of, mlp, seeded


@pytest.mark.parametrize("n", [0, 1, 2, 5, 1000, 70_001])
def test_preduce_gives_identical_bytes_and_keeps_the_sum(n: int) -> None:
    groups = {0: (0, 2, 3), 2: (0, 2, 3), 3: (0, 2, 3), 1: (1,)}
    data = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(4)]
    before = [d.copy() for d in data]

    def rank(r: int, ep: Endpoint) -> Any:
        return preduce(ep, data[r], groups[r], gid=5, role=16)

    with endpoints(4) as eps:
        losses = each_rank(eps, rank)
    assert data[2].tobytes() == data[0].tobytes() == data[3].tobytes()
    np.testing.assert_allclose(data[0] * 3, before[0] + before[2] + before[3], rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    assert data[1].tobytes() == before[1].tobytes()  # a group of one moves nothing
    assert all(loss.lost == 0 for loss in losses)


def test_preduce_under_loss_agrees_and_stays_within_the_bound() -> None:
    data = [np.random.default_rng(r).standard_normal(200_000).astype(np.float32) for r in range(3)]

    def rank(r: int, ep: Endpoint) -> Any:
        return [preduce(ep, data[r], (0, 1, 2), gid=g, role=16, p=0.05) for g in range(3)]

    with endpoints(3, emulated_loss=0.04) as eps:
        losses = each_rank(eps, rank)
    assert data[0].tobytes() == data[1].tobytes() == data[2].tobytes()
    lost = sum(loss.lost for per_rank in losses for loss in per_rank)
    for per_rank in losses:
        for loss in per_rank:
            assert loss.lost <= 0.05 * loss.bounded
    assert lost > 0


@pytest.mark.parametrize(("world", "k", "rounds"), [(4, 2, 2), (8, 2, 3), (4, 4, 1)])
def test_ds_sync_reaches_the_global_mean_in_the_rounds_its_schedule_implies(
    world: int, k: int, rounds: int
) -> None:
    def rank(r: int, ep: Endpoint) -> Any:
        p = torch.nn.Parameter(torch.full((7,), float(r)))
        model = torch.nn.ParameterList([p])
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # constant: only averaging moves it
        sync = make("ds-sync", model, opt, endpoint=ep, world_size=world, group_size=k, seed=4)
        assert sync.schedule.rounds_to_mix == rounds  # type: ignore[attr-defined]
        held = []
        for _ in range(rounds):
            p.grad = torch.zeros_like(p)
            rep = sync.step()
            assert len(rep.group) == k and r in rep.group
            held.append(p.detach().numpy().copy())
        sync.close()
        return held

    with endpoints(world) as eps:
        results = each_rank(eps, rank)
    mean = (world - 1) / 2
    for held in results:
        np.testing.assert_allclose(held[-1], mean, rtol=1e-6)
    if rounds > 1:  # not before
        assert any(not np.allclose(held[-2], mean) for held in results)


def test_ds_sync_trains_and_refuses_a_group_size_that_does_not_divide() -> None:
    world = 4

    def rank(r: int, ep: Endpoint) -> Any:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(Exception, match="does not divide the 4 workers"):
            make("ds-sync", model, opt, endpoint=ep, world_size=world, group_size=3)
        sync = make("ds-sync", model, opt, endpoint=ep, world_size=world, group_size=2)
        losses = []
        for t in range(6):
            opt.zero_grad()
            loss = loss_of(model, r, t % 2)
            loss.backward()
            losses.append(loss.item())
            sync.step()
        sync.close()
        return losses

    with endpoints(world) as eps:
        results = each_rank(eps, rank)
    assert all(np.isfinite(x) for losses in results for x in losses)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ripples_with_a_slow_worker_and_random_delays_never_deadlocks(seed: int) -> None:
    world, rounds, slow = 4, 9, {3: 3}
    gen = GroupGenerator(world, 2, seed=seed, slowdown=slow)

    def rank(r: int, ep: Endpoint) -> Any:
        rng = random.Random(seed * 100 + r)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        sync = make("ripples", model, opt, endpoint=ep, world_size=world, group_size=2,
                    seed=seed, slowdown=slow)  # fmt: skip
        groups = []
        for t in range(gen.steps_of(r, rounds)):
            time.sleep(rng.uniform(0, 0.01) * slow.get(r, 1))  # this iteration's compute
            opt.zero_grad()
            loss_of(model, r, t).backward()
            groups.append(sync.step().group)
        sync.close()
        return groups

    with endpoints(world) as eps:
        results = each_rank(eps, rank, timeout=60)
    assert len(results[3]) == 3 and all(len(results[w]) == rounds for w in range(3))
    # every member saw the same groups, in the same order
    for w in range(world):
        for m in range(world):
            assert [g for g in results[w] if m in g] == [g for g in results[m] if w in g]


def test_a_member_that_dies_is_named_to_its_group() -> None:
    def rank(r: int, ep: Endpoint) -> Any:
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sync = make("ds-sync", model, opt, endpoint=ep, world_size=2, group_size=2)
        for t in range(20):
            if r == 1 and t == 2:
                ep.close()
                return None
            opt.zero_grad()
            loss_of(model, r, t).backward()
            try:
                sync.step()
            except WorkerFailed as exc:
                return exc
        return None

    with endpoints(2, timeout=5.0) as eps:
        started = time.monotonic()
        got = each_rank(eps, rank, timeout=30)
    assert isinstance(got[0], WorkerFailed) and got[0].rank == 1 and "rank 1" in str(got[0])
    assert time.monotonic() - started < 15


def test_ds_sync_under_loss_reports_it_and_keeps_groups_identical() -> None:
    world = 4

    def rank(r: int, ep: Endpoint) -> Any:
        model = seeded(0, lambda: torch.nn.Sequential(torch.nn.Linear(200, 300)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        sync = make("ds-sync", model, opt, endpoint=ep, world_size=world, p=0.05)
        out = []
        for t in range(3):
            opt.zero_grad()
            x = torch.randn(4, 200, generator=torch.Generator().manual_seed(r + t))
            model(x).sum().backward()
            rep = sync.step()
            out.append((rep, sync.flat.read()))
        sync.close()
        return out

    with endpoints(world, emulated_loss=0.03) as eps:
        results = each_rank(eps, rank)
    lost = 0
    for t in range(3):
        for r in range(world):
            rep, flat = results[r][t]
            assert rep.lost_fraction <= 0.05 and rep.bounded_elems > 0
            lost += rep.lost_elems
            for m in rep.group:  # every member of its group holds the same bytes
                assert results[m][t][1].tobytes() == flat.tobytes()
    assert lost > 0
