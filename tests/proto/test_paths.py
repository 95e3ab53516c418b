"""Spraying over paths: smooth weighted round-robin and loss-aware shares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcp.proto.paths import PathScheduler, path_loss_from_nack, weights_for_routes


def test_equal_weights_are_round_robin_across_calls() -> None:
    s = PathScheduler(4)
    out = np.concatenate([s.assign(3), s.assign(6), s.assign(3)])
    assert out.tolist() == [0, 1, 2, 3] * 3
    assert out.dtype == np.uint8


def test_smooth_interleaving() -> None:
    s = PathScheduler(3, [5, 1, 1])
    assert "".join("abc"[i] for i in s.assign(7)) == "aaabcaa"
    two = PathScheduler(2, [3, 1]).assign(400)
    gaps = np.diff(np.flatnonzero(two == 1))
    assert gaps.max() <= 5  # path 1 comes every 4 picks, never bunched up
    assert np.all(np.diff(np.flatnonzero(two == 0)) <= 2)


@pytest.mark.parametrize("weights", [[1, 1], [3, 1], [5, 2, 2, 1], [0.1, 10, 3], [1] * 8])
def test_long_run_shares_match_weights(weights: list[float]) -> None:
    s = PathScheduler(len(weights), weights, min_share=0.0)
    rng = np.random.default_rng(3)
    out = np.concatenate([s.assign(int(n)) for n in rng.integers(0, 200, 100)])
    n = len(out)
    assert n > 9000
    counts = np.bincount(out, minlength=len(weights))
    want = np.array(weights) / sum(weights)
    assert np.all(np.abs(counts / n - want) < 0.01)
    assert np.all(np.abs(counts - n * want) <= 3)  # within a few picks, not just 1 %


def test_ten_thousand_assignments_within_one_percent() -> None:
    s = PathScheduler(4, [4, 3, 2, 1])
    counts = np.bincount(s.assign(10_000), minlength=4)
    assert np.allclose(counts / 10_000, [0.4, 0.3, 0.2, 0.1], atol=0.01)


def test_assignment_is_deterministic() -> None:
    a, b = PathScheduler(5, [1, 2, 3, 4, 5]), PathScheduler(5, [1, 2, 3, 4, 5])
    assert a.assign(500).tolist() == b.assign(500).tolist()
    assert a.assign(0).tolist() == []


@settings(max_examples=60)
@given(
    weights=st.lists(st.floats(0.05, 20), min_size=1, max_size=10),
    calls=st.lists(st.integers(0, 300), min_size=1, max_size=20),
)
def test_counts_track_shares_for_any_call_pattern(weights: list[float], calls: list[int]) -> None:
    s = PathScheduler(len(weights), weights, min_share=0.0)
    out = np.concatenate([s.assign(n) for n in calls])
    assert len(out) == sum(calls)
    counts = np.bincount(out, minlength=len(weights))
    want = sum(calls) * s.effective_weights
    assert np.all(np.abs(counts - want) <= 2.0)


def test_lossy_path_loses_share_and_recovers() -> None:
    s = PathScheduler(4)
    for _ in range(10):
        s.on_loss_report([1000] * 4, [300, 0, 0, 0])
    assert s.loss[0] == pytest.approx(0.3, abs=0.01)
    w = s.effective_weights
    assert w[0] < 0.1 and np.all(w[1:] > 0.29)
    assert w.sum() == pytest.approx(1.0)
    counts = np.bincount(s.assign(4000), minlength=4)
    assert counts[0] < 400
    assert s.healthy().all()  # 30 % is lossy, not down
    for _ in range(20):  # (the estimate decays by 0.7 a report: 30 % takes 20 to fade)
        s.on_loss_report([1000] * 4, [0, 0, 0, 0])
    assert s.loss[0] < 0.01
    assert s.effective_weights[0] > 0.23


def test_default_sensitivity_halves_a_path_losing_one_percent() -> None:
    # what the module doc promises: 1 % loss halves a path's share against a clean
    # path's, 5 % leaves a sixth, and loss all paths share moves nothing
    s = PathScheduler(4, min_share=0.0)
    for _ in range(40):
        s.on_loss_report([10_000] * 4, [100, 500, 0, 0])
    assert s.loss[:2] == pytest.approx([0.01, 0.05], rel=1e-3)
    w = s.effective_weights
    assert w[0] / w[2] == pytest.approx(0.5, rel=1e-3)
    assert w[1] / w[2] == pytest.approx(1 / 6, rel=1e-3)
    assert w[2] == pytest.approx(w[3])
    shared = PathScheduler(4, min_share=0.0)
    for _ in range(40):
        shared.on_loss_report([10_000] * 4, [300] * 4)
    assert shared.effective_weights == pytest.approx([0.25] * 4)


def test_down_path_is_probed_with_min_share() -> None:
    s = PathScheduler(4, min_share=0.01)
    for _ in range(5):
        s.on_loss_report([100, 100, 100, 100], [100, 0, 0, 0])
    assert s.healthy().tolist() == [False, True, True, True]
    w = s.effective_weights
    # loss scaling alone would leave it ~3 %; a down path gets exactly min_share
    assert w[0] == pytest.approx(0.01)
    assert np.allclose(w[1:], 0.99 / 3)
    counts = np.bincount(s.assign(1000), minlength=4)
    assert 9 <= counts[0] <= 11  # still probed
    for _ in range(15):
        s.on_loss_report([10, 300, 300, 300], [0, 0, 0, 0])
    assert s.healthy().all()
    assert s.effective_weights[0] > 0.15


def test_paths_without_traffic_keep_their_estimate() -> None:
    s = PathScheduler(3)
    s.on_loss_report([100, 100, 100], [50, 10, 0])
    before = s.loss
    s.on_loss_report([0, 100, 0], [0, 0, 0])
    after = s.loss
    assert after[0] == before[0] and after[2] == before[2]
    assert after[1] == pytest.approx(0.7 * before[1])


@settings(max_examples=80)
@given(
    n=st.integers(1, 12),
    min_share=st.floats(0, 1),
    rounds=st.lists(st.lists(st.floats(0, 1), min_size=12, max_size=12), max_size=6),
)
def test_shares_sum_to_one_and_respect_min_share(
    n: int, min_share: float, rounds: list[list[float]]
) -> None:
    floor = min_share / n  # always a valid min_share
    s = PathScheduler(n, min_share=floor)
    for ratios in rounds:
        lost = (np.array(ratios[:n]) * 100).astype(int)
        s.on_loss_report(np.full(n, 100), lost)
        w = s.effective_weights
        assert w.sum() == pytest.approx(1.0)
        assert np.all(w >= floor - 1e-12)


def test_all_paths_down_still_spreads_by_loss() -> None:
    s = PathScheduler(2)
    for _ in range(6):
        s.on_loss_report([100, 100], [95, 80])
    assert not s.healthy().any()
    w = s.effective_weights
    assert w.sum() == pytest.approx(1.0) and w[0] < w[1]


@pytest.mark.parametrize(
    ("args", "kw", "needle"),
    [
        ((0,), {}, "n_paths=0 outside 1..256"),
        ((257,), {}, "n_paths=257"),
        ((2, [1.0]), {}, r"one weight per path \(2\)"),
        ((2, [1.0, -1.0]), {}, "finite and positive"),
        ((2,), {"loss_alpha": 0.0}, "loss_alpha=0.0"),
        ((2,), {"min_share": 0.6}, "min_share=0.6"),
        ((2,), {"down_loss": 0.0}, "down_loss=0.0"),
        ((2,), {"loss_sensitivity": -1.0}, "loss_sensitivity=-1.0"),
    ],
)
def test_scheduler_bad_options(args: tuple[object, ...], kw: dict[str, float], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        PathScheduler(*args, **kw)  # type: ignore[arg-type]


def test_loss_report_errors() -> None:
    s = PathScheduler(3)
    with pytest.raises(ValueError, match=r"sent must have one count per path \(3\)"):
        s.on_loss_report([1, 2], [0, 0])
    with pytest.raises(ValueError, match="path 1 lost 5 packets of only 2 sent"):
        s.on_loss_report([1, 2, 3], [0, 5, 0])
    with pytest.raises(ValueError, match="lost must not be negative"):
        s.on_loss_report([1, 2, 3], [0, -1, 0])
    with pytest.raises(ValueError, match="n=-1"):
        s.assign(-1)


def test_path_loss_from_nack() -> None:
    path_of_seq = np.array([0, 1, 2, 0, 1, 2, 0, 1], dtype=np.uint8)
    sent, lost = path_loss_from_nack(path_of_seq, np.array([3, 6, 6, 1]), 4)
    assert sent.tolist() == [3, 3, 2, 0]
    assert lost.tolist() == [2, 1, 0, 0]  # duplicate 6 counted once
    s = PathScheduler(4)
    s.on_loss_report(sent, lost)
    assert s.loss[0] > s.loss[1] > 0 and s.loss[3] == 0


def test_path_loss_from_nack_errors() -> None:
    seqs = np.array([0, 1, 0], dtype=np.uint8)
    with pytest.raises(ValueError, match=r"missing sequence 3 outside 0\.\.2"):
        path_loss_from_nack(seqs, np.array([3]), 2)
    with pytest.raises(ValueError, match=r"path 1, outside 0\.\.0"):
        path_loss_from_nack(seqs, np.array([0]), 1)
    with pytest.raises(ValueError, match="n_paths=0"):
        path_loss_from_nack(seqs, np.array([0]), 0)


# --- route-balanced base weights ---------------------------------------------------

A, B, C = ("leaf1", "spine1", "leaf2"), ("leaf1", "spine2", "leaf2"), ("leaf1", "spine3", "leaf2")


def _route_shares(routes: list[tuple[str, ...] | None], weights: tuple[float, ...]) -> dict:
    out: dict[tuple[str, ...] | None, float] = {}
    for route, w in zip(routes, weights, strict=True):
        out[route] = out.get(route, 0.0) + w
    return out


@pytest.mark.parametrize(
    "routes",
    [
        [A, A, A, A, A, A, A, B],  # the hash put 7 of 8 ports on one spine
        [A, B, B, A, B, B, B, B],
        [A, B, C, C, C, C, C, C],  # three spines, 1 / 1 / 6
    ],
)
def test_every_route_gets_the_same_share(routes: list[tuple[str, ...]]) -> None:
    weights = weights_for_routes(routes)
    assert weights is not None and len(weights) == len(routes)
    assert sum(weights) == pytest.approx(1.0)
    per_route = _route_shares(routes, weights)
    n = len(set(routes))
    assert list(per_route.values()) == pytest.approx([1 / n] * n)
    for i, j in [(i, j) for i in range(len(routes)) for j in range(len(routes))]:
        if routes[i] == routes[j]:
            assert weights[i] == weights[j]  # a route's share split equally among its paths
    # and the scheduler, given them, sends that way
    s = PathScheduler(len(routes), weights, min_share=0.0)
    picks = np.bincount(s.assign(8000), minlength=len(routes))
    sent = _route_shares(routes, tuple(float(c) for c in picks))
    assert list(sent.values()) == pytest.approx([8000 / n] * n, abs=2)


def test_a_path_of_unknown_route_keeps_an_equal_share() -> None:
    routes = [A, A, A, B, None, A, A, A]
    weights = weights_for_routes(routes)
    assert weights is not None
    assert weights[4] == pytest.approx(1 / 8)
    per_route = _route_shares(routes, weights)
    assert per_route[A] == pytest.approx(per_route[B]) == pytest.approx((1 - 1 / 8) / 2)


@pytest.mark.parametrize("routes", [[A, A, A, A], [None, None, None], [A, None, A, None], [B]])
def test_nothing_to_even_out_without_two_known_routes(routes: list) -> None:
    assert weights_for_routes(routes) is None


def test_weights_for_no_paths_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one path"):
        weights_for_routes([])


def test_set_weights_keeps_the_loss_estimates() -> None:
    s = PathScheduler(4)
    s.on_loss_report([100, 100, 100, 100], [0, 10, 0, 0])
    lossy = s.loss.copy()
    s.set_weights([3.0, 1.0, 1.0, 1.0])
    assert s.loss.tolist() == lossy.tolist()
    shares = s.effective_weights
    assert shares[0] > shares[2] > shares[1]
    assert shares[2] == pytest.approx(shares[3])
    assert shares.sum() == pytest.approx(1.0)
    s.set_weights(None)  # back to equal base weights: only the loss tells them apart
    assert s.effective_weights[0] == pytest.approx(s.effective_weights[2])
    with pytest.raises(ValueError, match=r"one weight per path \(4\)"):
        s.set_weights([1.0, 1.0])
    with pytest.raises(ValueError, match="finite and positive"):
        s.set_weights([1.0, 0.0, 1.0, 1.0])
