"""Group schedules (``dlcp.sync.groups``), without sockets: DS-Sync's divisions
partition the workers, change every round and, averaged, give the exact global
mean in ``rounds_to_mix`` rounds; Ripples' generator leaves slow workers out of
most rounds; Group Buffers consumed under random delays never deadlock (an
event simulation that does find the deadlock of buffers each rank ordered by
itself)."""

from __future__ import annotations

import heapq
import itertools
import random

import numpy as np
import pytest

from dlcp.errors import ConfigError
from dlcp.sync.groups import (
    Group,
    GroupBuffer,
    GroupGenerator,
    ShuffleSchedule,
    divide,
    exact_power,
)


def _is_partition(groups: list[tuple[int, ...]], workers: list[int]) -> bool:
    flat = [w for g in groups for w in g]
    return sorted(flat) == sorted(workers) and len(flat) == len(set(flat))


@pytest.mark.parametrize(("n", "k"), [(4, 2), (8, 2), (9, 3), (6, 2), (6, 3), (8, 4), (4, 4)])
def test_shuffle_divisions_partition_and_change_every_round(n: int, k: int) -> None:
    s = ShuffleSchedule(n, k, seed=7)
    again = ShuffleSchedule(n, k, seed=7)
    seen = []
    for r in range(12):
        groups = s.division(r)
        assert _is_partition(groups, list(range(n)))
        assert all(len(g) == k for g in groups)
        assert groups == again.division(r)  # every rank computes the same
        seen.append(groups)
    if k < n:
        assert all(a != b for a, b in itertools.pairwise(seen))  # reshuffled
        assert seen != [ShuffleSchedule(n, k, seed=8).division(r) for r in range(12)]


@pytest.mark.parametrize(("n", "k", "m"), [(4, 2, 2), (8, 2, 3), (9, 3, 2), (16, 4, 2), (5, 5, 1)])
def test_averaging_in_shuffled_groups_reaches_the_global_mean_in_rounds_to_mix(
    n: int, k: int, m: int
) -> None:
    s = ShuffleSchedule(n, k, seed=3)
    assert s.rounds_to_mix == m
    for start_epoch in range(3):
        x = np.random.default_rng(start_epoch).standard_normal((n, 5))
        mean = x.mean(axis=0)
        for r in range(start_epoch * m, start_epoch * m + m):
            if r == start_epoch * m + m - 1:  # not one round early
                assert not np.allclose(x, mean, atol=1e-9)
            for g in s.division(r):
                x[list(g)] = x[list(g)].mean(axis=0)
        np.testing.assert_allclose(x, np.broadcast_to(mean, x.shape), atol=1e-12)


def test_without_an_exact_schedule_the_spread_still_contracts() -> None:
    s = ShuffleSchedule(6, 2, seed=1)
    assert s.rounds_to_mix is None
    x = np.arange(6, dtype=np.float64)
    for r in range(40):
        for g in s.division(r):
            x[list(g)] = x[list(g)].mean()
    assert np.ptp(x) < 1e-3 * 5 and x.mean() == pytest.approx(2.5)


def test_group_size_must_divide_the_workers_for_ds_sync() -> None:
    with pytest.raises(ConfigError, match="group_size=4 does not divide the 6 workers"):
        ShuffleSchedule(6, 4)
    with pytest.raises(ConfigError, match="group_size=0 must be an integer >= 1"):
        ShuffleSchedule(6, 0)
    with pytest.raises(ConfigError, match="exceeds the 3 workers"):
        GroupGenerator(3, 4)
    assert exact_power(27, 3) == 3 and exact_power(12, 2) is None


def test_slow_workers_join_fewer_groups() -> None:
    g = GroupGenerator(6, 2, seed=2, slowdown={5: 3})
    joined = {w: g.steps_of(w, 30) for w in range(6)}
    assert joined[5] == 10 and all(joined[w] == 30 for w in range(5))
    for r in range(30):
        active = [w for w in range(6) if w != 5 or r % 3 == 0]
        assert _is_partition(g.round(r), active)
    with pytest.raises(ConfigError, match="homogeneous"):
        GroupGenerator(6, 2, slowdown={5: 3}, static=True)
    with pytest.raises(ConfigError, match="outside the world"):
        GroupGenerator(6, 2, slowdown={6: 2})


def test_the_static_schedule_is_fixed_and_mixes() -> None:
    a, b = GroupGenerator(8, 2, static=True, seed=1), GroupGenerator(8, 2, static=True, seed=9)
    assert [a.round(r) for r in range(6)] == [b.round(r) for r in range(6)]  # no randomness
    assert a.round(0) == [(0, 1), (2, 3), (4, 5), (6, 7)] and a.round(1)[0] == (0, 2)
    rot = GroupGenerator(6, 4, static=True)
    assert rot.round(0) == [(0, 1, 2, 3), (4, 5)] and rot.round(1) == [(1, 2, 3, 4), (0, 5)]


def _simulate(buffers: dict[int, list[Group]], rng: random.Random) -> bool:
    """Workers compute for a random time, then wait at their next group until every
    member is there; True when every worker consumes its whole buffer."""
    pos = dict.fromkeys(buffers, 0)
    waiting: dict[int, set[int]] = {}
    events = [(rng.uniform(0, 3), w) for w in buffers]
    heapq.heapify(events)
    while events:
        t, w = heapq.heappop(events)
        if pos[w] == len(buffers[w]):
            continue
        g = buffers[w][pos[w]]
        here = waiting.setdefault(g.gid, set())
        here.add(w)
        if here == set(g.members):
            for m in g.members:
                pos[m] += 1
                heapq.heappush(events, (t + rng.uniform(0, 3) * (3 if m == 0 else 1), m))
    return all(pos[w] == len(buffers[w]) for w in buffers)


def test_group_buffers_never_deadlock_under_random_delays() -> None:
    for seed in range(200):
        rng = random.Random(seed)
        n, k = rng.choice([(4, 2), (6, 3), (7, 2), (8, 4), (5, 3)])
        slow = {0: rng.choice([1, 2, 3])}
        gen = GroupGenerator(n, k, seed=seed, slowdown=slow)
        rounds = 20
        buffers = {}
        for w in range(n):
            buf = GroupBuffer(GroupGenerator(n, k, seed=seed, slowdown=slow), w, ahead=8)
            buffers[w] = [buf.next() for _ in range(gen.steps_of(w, rounds))]
        assert _simulate(buffers, rng), f"deadlock with seed {seed}"
    # the simulation does find a deadlock: buffers that each rank orders by itself
    found = False
    for seed in range(50):
        gen = GroupGenerator(4, 2, seed=seed)
        seq = [g for g, _ in zip(gen.sequence(), range(40), strict=False)]
        own = {w: [g for g in seq if w in g.members] for w in range(4)}
        for w in own:
            random.Random(seed * 10 + w).shuffle(own[w])
        found |= not _simulate(own, random.Random(seed))
    assert found


def test_divide_cuts_into_groups_of_k() -> None:
    assert divide([5, 1, 3, 2, 4], 2, None) == [(1, 5), (2, 3), (4,)]
    assert _is_partition(divide(range(9), 4, random.Random(1)), list(range(9)))
