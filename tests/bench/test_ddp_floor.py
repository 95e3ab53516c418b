"""The DDP benchmark's UDP floor (``dlcp/bench/ddp_floor.py``) averages correctly.

Its figure is only a floor if it does the ring's whole work: every rank must
end with the mean of every rank's array, bit for bit the same on each rank.
Three ranks in threads of this process, over real UDP sockets on the loopback,
with arrays whose chunks end in a short datagram, several buckets in a row (the
receive sockets alternate by bucket), and a lost datagram that must fail the
step instead of passing unnoticed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dlcp.bench import ddp_floor
from dlcp.bench.ddp_floor import FloorError, UdpRingFloor

pytestmark = pytest.mark.integration


def _ranks(world: int) -> list[UdpRingFloor]:
    ranks = [UdpRingFloor(r, world) for r in range(world)]
    every = [f.addresses for f in ranks]
    for f in ranks:
        f._right = every[(f.rank + 1) % world]  # (connect() also starts the hook thread)
    return ranks


def _in_threads(ranks: list[UdpRingFloor], work: Callable[[UdpRingFloor], Any]) -> list[Any]:
    results: list[Any] = [None] * len(ranks)

    def run(f: UdpRingFloor) -> None:
        try:
            results[f.rank] = work(f)
        except BaseException as exc:
            results[f.rank] = exc

    threads = [threading.Thread(target=run, args=(f,)) for f in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a floor rank hung"
    return results


def _averages_every_bucket(ranks: list[UdpRingFloor], buckets: list[np.ndarray]) -> None:
    """Each rank averages its row of every bucket in turn (``buckets[k]`` is world x
    n); every rank ends with the mean, bit for bit the same on each."""

    def work(f: UdpRingFloor) -> list[np.ndarray]:
        out = []
        for b in buckets:
            mine = b[f.rank].copy()
            f.allreduce(mine)
            out.append(mine)
        return out

    results = _in_threads(ranks, work)
    for r in results:
        assert not isinstance(r, BaseException), r
    for k, b in enumerate(buckets):
        np.testing.assert_allclose(results[0][k], b.mean(axis=0), rtol=1e-5, atol=1e-6)
        for r in range(1, len(ranks)):  # identical replicas
            assert results[r][k].tobytes() == results[0][k].tobytes()


# (360 float32 fill a datagram: 360 * 7 * 3 ends each chunk of three ranks in a
# full datagram, so one read may run from one step into the next)
@pytest.mark.parametrize("n_elems", [5, 1000, 360 * 7 + 13, 360 * 7 * 3, 300_001])
def test_every_rank_ends_with_the_mean_of_all_ranks_arrays(n_elems: int) -> None:
    world = 3
    ranks = _ranks(world)
    try:
        rng = np.random.default_rng(n_elems)
        # three buckets: both parities, and back to the first
        buckets = [rng.standard_normal((world, n_elems), dtype=np.float32) for _ in range(3)]
        _averages_every_bucket(ranks, buckets)
    finally:
        for f in ranks:
            f.close()


def test_buckets_of_other_sizes_in_a_row_reuse_the_scratch_and_stay_exact() -> None:
    """The reduce-scatter's scratch is kept from call to call (as the ring's is):
    a smaller bucket after a larger one, and a larger one after that, still
    average exactly (a step reads only its own part of the scratch)."""
    world = 3
    ranks = _ranks(world)
    try:
        rng = np.random.default_rng(7)
        sizes = [300_001, 1000, 360 * 7 + 13, 400_003, 5]
        _averages_every_bucket(
            ranks, [rng.standard_normal((world, n), dtype=np.float32) for n in sizes]
        )
        # one scratch per rank, as large as the largest bucket's steps needed
        widest = -(-400_003 // world)
        assert all(
            widest * (world - 1) <= len(f._scratch) <= (widest + 1) * (world - 1) for f in ranks
        )
    finally:
        for f in ranks:
            f.close()


def test_a_lost_datagram_fails_its_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ddp_floor, "FLOOR_TIMEOUT_S", 0.5)
    ranks = _ranks(2)
    real_send = ranks[0]._socks[0].send_gathered
    dropped = []

    def send_losing_the_first(heads: Any, payload: Any, chunk: int, **kw: Any) -> int:
        if not dropped:  # rank 0's first datagram never leaves
            dropped.append(chunk)
            heads, payload = heads[1:], payload[chunk:]
            if len(heads) == 0:
                return 0
        return int(real_send(heads, payload, chunk, **kw))

    monkeypatch.setattr(ranks[0]._socks[0], "send_gathered", send_losing_the_first)
    try:
        arrays = [np.ones(50_000, np.float32) for _ in ranks]
        results = _in_threads(ranks, lambda f: f.allreduce(arrays[f.rank]))
        assert isinstance(results[1], FloorError), results
        assert "misses" in str(results[1]) and "lost" in str(results[1]), results[1]
    finally:
        for f in ranks:
            f.close()
