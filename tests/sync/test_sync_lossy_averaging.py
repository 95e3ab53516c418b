"""Schemes that average parameters under a loss bound (``p > 0``, 5 % emulated loss
of data datagrams): with a learning rate of 0 every replica stays at the common
start, and the average of identical replicas is that start, so no round may move
a parameter, however many elements its messages lost. (ShadowSync's S-MA summed
the raw parameters, and DS-Sync's P-Reduce zero-filled or rescaled lost ones:
both pulled parameters towards 0, some to a twentieth of their value.) And a
step's reported loss is its collective's."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import torch

import dlcp.sync.allreduce as sync_allreduce
from dlcp.errors import ConfigError
from dlcp.io import Endpoint
from dlcp.sync import make
from tests.sync.sync_helpers import each_rank, endpoints, seeded

pytestmark = pytest.mark.integration

WORLD = 4
LOSS = 0.05


def _model() -> torch.nn.Module:
    return seeded(0, lambda: torch.nn.Linear(1000, 200))


def _flat(model: torch.nn.Module) -> np.ndarray[Any, Any]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def test_shadow_averaging_under_loss_leaves_identical_replicas_as_they_were() -> None:
    def rank(r: int, ep: Endpoint) -> tuple[Any, Any, int, int]:
        model = _model()
        start = _flat(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        sync = make("shadow-ma", model, opt, endpoint=ep, world_size=WORLD, p=0.05)
        lost, deadline = 0, time.monotonic() + 60
        while sync.rounds < 6:  # (the first round is exact; the later ones lose)
            assert time.monotonic() < deadline, sync.rounds
            lost += sync.step().lost_elems
            time.sleep(0.005)  # (polling the background rounds' count)
        sync.close()
        return start, _flat(model), sync.rounds, lost

    with endpoints(WORLD, emulated_loss=LOSS) as eps:
        results = each_rank(eps, rank, timeout=120)
    assert sum(lost for *_, lost in results) > 0  # (rounds did lose elements)
    for start, now, _, _ in results:
        np.testing.assert_allclose(now, start, rtol=0, atol=1e-6)


def test_group_averaging_under_loss_leaves_identical_replicas_as_they_were() -> None:
    def rank(r: int, ep: Endpoint) -> tuple[Any, Any, int]:
        model = _model()
        start = _flat(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        with pytest.raises(ConfigError, match=r"fill='zero' with p=0\.05: averaging parameters"):
            make("ds-sync", model, opt, endpoint=ep, world_size=WORLD, p=0.05, fill="zero")
        sync = make("ds-sync", model, opt, endpoint=ep, world_size=WORLD, p=0.05)
        lost = sum(sync.step().lost_elems for _ in range(5))
        sync.close()
        return start, _flat(model), lost

    with endpoints(WORLD, emulated_loss=LOSS) as eps:
        results = each_rank(eps, rank, timeout=120)
    assert sum(lost for *_, lost in results) > 0
    for start, now, _ in results:
        np.testing.assert_allclose(now, start, rtol=0, atol=1e-6)


def test_a_steps_loss_is_its_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[int, list[Any]] = {}
    ring = sync_allreduce.ring_allreduce

    def kept(comm: Any, data: Any, **kw: Any) -> Any:
        rep = ring(comm, data, **kw)
        seen.setdefault(comm.rank, []).append(rep)
        return rep

    monkeypatch.setattr(sync_allreduce, "ring_allreduce", kept)

    def rank(r: int, ep: Endpoint) -> list[Any]:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        sync = make("allreduce", model, opt, endpoint=ep, world_size=2, p=0.05)
        steps = []
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(4, 1000)).sum().backward()
            steps.append(sync.step())
        sync.close()
        return steps

    with endpoints(2, emulated_loss=LOSS) as eps:
        steps = each_rank(eps, rank, timeout=120)
    pairs = [(s, c) for r in range(2) for s, c in zip(steps[r], seen[r], strict=True)]
    assert any(s.lost_elems for s, _ in pairs)
    for step, collective in pairs:
        assert step.bounded_elems == collective.bounded_elems < collective.elems
        assert step.lost_fraction == collective.lost_fraction
