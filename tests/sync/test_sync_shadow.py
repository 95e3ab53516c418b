"""ShadowSync (``dlcp.sync.shadow``) on real endpoints: training steps go on while
a background round is in flight; the replicas' divergence stays bounded where
unsynchronised replicas drift apart; S-EASGD, S-MA and S-BMUF each converge on
the synthetic click-through-rate task; the CTR generator's metrics are right."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

from dlcp.errors import ConfigError, TransferFailed
from dlcp.io import Endpoint
from dlcp.sync import make
from dlcp.sync.workloads import CTRModel, CTRTask, auc
from tests.sync.sync_helpers import each_rank, endpoints, seeded

TASK = CTRTask(buckets=1024, vocab=100, seed=3)


def _train(algorithm: str, world: int, steps: int, **options: Any) -> list[Any]:
    def rank(r: int, ep: Endpoint) -> Any:
        model = seeded(0, lambda: CTRModel(buckets=1024, dim=8, hidden=16))
        opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
        sync = make(f"shadow-{algorithm}", model, opt, endpoint=ep, world_size=world,
                    **options)  # fmt: skip
        before = TASK.evaluate(model)
        for t in range(steps):
            ids, labels = TASK.batch(64, seed=r * 10_000 + t)
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(model(ids), labels).backward()
            sync.step()
        sync.close()
        return before, TASK.evaluate(model), sync.rounds  # type: ignore[attr-defined]

    with endpoints(world) as eps:
        return each_rank(eps, rank, timeout=90)


@pytest.mark.parametrize("algorithm", ["easgd", "ma", "bmuf"])
def test_each_algorithm_converges_on_the_ctr_task(algorithm: str) -> None:
    results = _train(algorithm, 3, 150, interval=0.005)
    for before, after, rounds in results:
        assert rounds >= 3
        assert after["log_loss"] < before["log_loss"] - 0.1, (before, after)
        assert after["auc"] > 0.6 and after["auc"] > before["auc"] + 0.1, (before, after)


def test_steps_go_on_while_a_round_is_in_flight_and_replicas_stay_close() -> None:
    world, steps = 3, 120
    step_times: dict[int, list[float]] = {}

    def rank(r: int, ep: Endpoint) -> Any:
        model = seeded(0, lambda: CTRModel(buckets=1024, dim=8, hidden=16))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        sync = make("shadow-ma", model, opt, endpoint=ep, world_size=world)
        times, flats = [], []
        for t in range(steps):
            ids, labels = TASK.batch(32, seed=r * 10_000 + t)
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(model(ids), labels).backward()
            sync.step()
            times.append(time.perf_counter())
            time.sleep(0.005)  # (the rest of an iteration's compute)
            if t % 20 == 19:
                flats.append(sync.flat.read())
        step_times[r] = times
        sync.close()
        return flats, sync.trace  # type: ignore[attr-defined]

    with endpoints(world) as eps:
        synced = each_rank(eps, rank, timeout=90)
    # steps completed inside a round's (start, end): training did not wait for it
    inside = sum(any(a < t < b for a, b in synced[r][1]) for r in step_times
                 for t in step_times[r])  # fmt: skip
    assert inside > 0

    def alone(r: int) -> list[np.ndarray]:
        model = seeded(0, lambda: CTRModel(buckets=1024, dim=8, hidden=16))
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        flats = []
        for t in range(steps):
            ids, labels = TASK.batch(32, seed=r * 10_000 + t)
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(model(ids), labels).backward()
            opt.step()
            if t % 20 == 19:
                flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                flats.append(flat.numpy())
        return flats

    unsynced = [alone(r) for r in range(world)]

    def spread(flats: list[list[np.ndarray]], i: int) -> float:
        return max(float(np.linalg.norm(flats[a][i] - flats[b][i]))
                   for a in range(world) for b in range(a))  # fmt: skip

    synced_flats = [s[0] for s in synced]
    checkpoints = len(unsynced[0])
    with_sync = [spread(synced_flats, i) for i in range(checkpoints)]
    without = [spread(unsynced, i) for i in range(checkpoints)]
    assert without[-1] > without[0]  # unsynchronised replicas drift apart
    # (the first checkpoint may come before the first round has ended)
    later = range(1, checkpoints)
    assert np.mean([with_sync[i] for i in later]) < 0.5 * np.mean([without[i] for i in later]), (
        with_sync, without)  # fmt: skip
    assert max(with_sync[i] for i in later) < 0.8 * without[-1], (with_sync, without)


def test_shadow_settings_are_checked() -> None:
    model = CTRModel(buckets=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    class Rank:
        rank = 0

    with pytest.raises(ConfigError, match="alpha=0"):
        make("shadow-easgd", model, opt, endpoint=Rank(), world_size=2, alpha=0)
    with pytest.raises(ConfigError, match="servers= applies to algorithm 'easgd' only"):
        make("shadow-ma", model, opt, endpoint=Rank(), world_size=2, servers=[0])
    with pytest.raises(ConfigError, match="momentum=1"):
        make("shadow-bmuf", model, opt, endpoint=Rank(), world_size=2, momentum=1)


def test_the_ctr_generator_and_its_metrics() -> None:
    assert auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == 0.75
    assert auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5
    ids, labels = TASK.batch(5000, seed=1)
    assert ids.shape == (5000, TASK.fields) and int(ids.max()) < TASK.buckets
    assert 0.1 < float(labels.mean()) < 0.6
    again, _ = TASK.batch(5000, seed=1)
    assert torch.equal(ids, again)


def test_a_dead_peer_surfaces_as_an_error_not_a_hang() -> None:
    def rank(r: int, ep: Endpoint) -> Any:
        model = seeded(0, lambda: CTRModel(buckets=64, dim=4, hidden=4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sync = make("shadow-ma", model, opt, endpoint=ep, world_size=2)
        if r == 1:
            while sync.rounds < 2:  # type: ignore[attr-defined]
                sync.step()
            ep.close()  # dies without a word
            return None
        started = time.monotonic()
        with pytest.raises(TransferFailed, match="rank 1"):
            while time.monotonic() - started < 20:
                sync.step()
                time.sleep(0.01)
            sync.close()
        return time.monotonic() - started

    with endpoints(2, timeout=3.0) as eps:
        took = each_rank(eps, rank, timeout=40)
    assert took[0] < 15
