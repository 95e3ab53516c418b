"""The receiver's rate meter (dlcp.proto.rate_meter): rates over busy time, windows
and deadlines, batches equal to single calls, bad input named."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.proto.rate_meter import RateMeter


def test_rate_meter_reports_rate_over_busy_time() -> None:
    meter = RateMeter(interval=0.1, min_busy=0.1)
    meter.on_bytes(1, 1000, now=0.0)
    meter.on_idle(0.05, now=0.1)  # half of the 0.1 s window spent waiting
    assert meter.sample(now=0.1)[1] == pytest.approx(1000 / 0.05)
    meter.on_bytes(1, 1000, now=0.1)
    meter.on_idle(5.0, now=0.2)  # longer than the window: only the window counts...
    assert meter.sample(now=0.2)[1] == pytest.approx(1000 / (0.1 * 0.1))  # ...capped


def test_rate_meter_ignores_idle_time_outside_a_window() -> None:
    meter = RateMeter(interval=0.1)
    meter.on_idle(1.0, now=1.0)  # no window open: nothing to charge it to
    meter.on_bytes(1, 500, now=1.0)
    meter.on_idle(0.5, now=1.02)  # only 0.02 s of it lies in the window
    assert meter.sample(now=1.1)[1] == pytest.approx(500 / 0.08)


#: a meter whose shared windows report the equal share itself, without the step
#: the port's room decides (tests/proto/test_pacing_shared.py)
NO_STEP = {"share_probe": 0.0, "share_drain": 0.0}


def test_rate_meter_measures_known_rates() -> None:
    meter = RateMeter(interval=0.01, **NO_STEP)
    samples: list[dict[int, float]] = []
    for i in range(1000):  # 1 s: src 3 sends 1000 B/ms, src 7 500 B/ms
        t = i * 1e-3
        if meter.due(now=t):
            samples.append(meter.sample(now=t))
        meter.on_bytes(3, 1000, now=t)
        meter.on_bytes(7, 500, now=t)
    assert len(samples) >= 95
    for s in samples:
        assert s.keys() == {3, 7}
        # (two sources: each is told an equal share of the 1.5e6 B/s they brought)
        assert s[3] == pytest.approx(7.5e5, rel=0.01)
        assert s[7] == pytest.approx(7.5e5, rel=0.01)


def test_rate_meter_windows_and_deadlines() -> None:
    meter = RateMeter(interval=0.1)
    assert meter.next_deadline() is None
    assert not meter.due(now=5.0)
    assert meter.sample(now=5.0) == {}
    meter.on_bytes(1, 1000, now=1.0)
    assert meter.next_deadline() == pytest.approx(1.1)
    assert not meter.due(now=1.05)
    assert meter.due(now=1.1)
    assert meter.sample(now=1.2) == {1: pytest.approx(5000.0)}
    # traffic flowed: the next window opened at once; nothing arrives in it
    assert meter.next_deadline() == pytest.approx(1.3)
    assert meter.sample(now=1.3) == {}
    assert meter.next_deadline() is None


def test_rate_meter_only_reports_sources_that_sent() -> None:
    meter = RateMeter(interval=0.1)
    meter.on_bytes(1, 100, now=0.0)
    meter.on_bytes(2, 100, now=0.0)
    meter.sample(now=0.1)
    meter.on_bytes(2, 300, now=0.15)
    assert meter.sample(now=0.2) == {2: pytest.approx(3000.0)}


def test_rate_meter_sample_at_window_start_keeps_window() -> None:
    meter = RateMeter(interval=0.1)
    meter.on_bytes(1, 100, now=2.0)
    assert meter.sample(now=2.0) == {}
    assert meter.sample(now=2.1) == {1: pytest.approx(1000.0)}


def test_rate_meter_batch_equals_single() -> None:
    a, b = RateMeter(0.1, **NO_STEP), RateMeter(0.1, **NO_STEP)
    srcs = np.array([4, 1, 4, 4, 2], dtype=np.uint16)
    sizes = np.array([100, 200, 300, 50, 7], dtype=np.int64)
    a.on_batch(srcs, sizes, now=0.0)
    for s, n in zip(srcs.tolist(), sizes.tolist(), strict=True):
        b.on_bytes(s, n, now=0.0)
    # (three sources: each is told an equal share of the 657 bytes over 0.1 s)
    assert a.sample(now=0.1) == b.sample(now=0.1) == {4: 2190.0, 1: 2190.0, 2: 2190.0}


def test_several_sources_are_told_an_equal_share_without_the_idle_claim() -> None:
    meter = RateMeter(interval=0.1, **NO_STEP)
    # three senders into one port: one its pacer had cut brought a tenth of the others
    meter.on_bytes(1, 100, now=0.0)
    meter.on_bytes(2, 1000, now=0.0)
    meter.on_bytes(3, 1000, now=0.05)
    meter.on_idle(0.08, now=0.1)  # the receiver waited most of the window
    # 2100 / 3 bytes each over the whole 0.1 s, not twice that for the waiting
    assert meter.sample(now=0.1) == {src: pytest.approx(7000.0) for src in (1, 2, 3)}
    meter.on_bytes(1, 100, now=0.1)
    meter.on_idle(0.08, now=0.2)
    assert meter.sample(now=0.2) == {1: pytest.approx(2000.0)}  # alone: the claim again


def test_a_source_whose_data_went_missing_is_told_what_arrived_for_claim_hold() -> None:
    """An idle receiver claims it could take twice what came, which on a slow link
    invites its sender to twice the link's rate. After it NACKed the sender
    (withhold_claim) it reports what arrived, until ``claim_hold`` has passed; the
    claim is per source."""
    meter = RateMeter(interval=0.1, claim_hold=0.25, **NO_STEP)

    def window(start: float) -> dict[int, float]:
        meter.on_bytes(1, 1000, now=start)
        meter.on_idle(0.09, now=start + 0.1)  # nine tenths of the window waiting
        return meter.sample(now=start + 0.1)

    assert window(0.0) == {1: pytest.approx(1000 / 0.05)}  # the claim (capped at 2x)
    meter.withhold_claim(1, now=0.1)
    meter.withhold_claim(2, now=0.1)  # (another source's hold changes nothing for 1)
    assert window(0.1) == {1: pytest.approx(1000 / 0.1)}  # what arrived
    assert window(0.2) == {1: pytest.approx(1000 / 0.1)}
    assert window(0.3) == {1: pytest.approx(1000 / 0.05)}  # 0.25 s on: the claim again
    meter.withhold_claim(1, now=0.4)
    meter.on_bytes(1, 1000, now=0.4)
    meter.on_bytes(3, 1000, now=0.4)  # two sources: an equal share, as always
    assert meter.sample(now=0.5) == {1: pytest.approx(1e4), 3: pytest.approx(1e4)}


def test_a_steady_lone_source_gets_the_longer_window() -> None:
    """``lone_interval``: while at most one source has messages under way and its
    last report moved less than ``steady`` from the one before, a window lasts
    that long (each deadline is a turn of the receiver's driver); a rate that
    moves, or a second source's message, brings back ``interval`` (the second
    source cuts the open window to ``interval`` from its start)."""
    meter = RateMeter(interval=0.005, lone_interval=0.02, steady=0.1, **NO_STEP)
    meter.senders_under_way(1)
    t = 0.0
    for nbytes in (1000, 1000):  # a first report, then one that did not move
        meter.on_bytes(1, nbytes, now=t)
        assert meter.next_deadline() == pytest.approx(t + 0.005)
        t += 0.005
        assert meter.sample(now=t) == {1: pytest.approx(nbytes / 0.005)}
    assert meter.next_deadline() == pytest.approx(t + 0.02)  # steady: a long window
    meter.on_bytes(1, 4000, now=t)  # the same rate over four times as long
    assert not meter.due(now=t + 0.01)
    t += 0.02
    assert meter.sample(now=t) == {1: pytest.approx(2e5)}
    assert meter.measured == pytest.approx(0.02)
    assert meter.next_deadline() == pytest.approx(t + 0.02)
    meter.on_bytes(1, 8000, now=t)  # twice the rate: moved, the next window is short
    t += 0.02
    meter.sample(now=t)
    assert meter.next_deadline() == pytest.approx(t + 0.005)
    meter.on_bytes(1, 2000, now=t)  # (4e5 B/s again: steady, long)
    t += 0.005
    meter.sample(now=t)
    assert meter.next_deadline() == pytest.approx(t + 0.02)
    meter.on_bytes(1, 1000, now=t + 0.001)
    meter.senders_under_way(2)  # a second source: the window is due 5 ms from its start
    assert meter.next_deadline() == pytest.approx(t + 0.005)
    meter.on_bytes(2, 1000, now=t + 0.002)
    assert meter.sample(now=t + 0.005) == {1: pytest.approx(2e5), 2: pytest.approx(2e5)}
    assert meter.shared and meter.measured == pytest.approx(0.005)
    meter.senders_under_way(1)  # alone again: short windows until its rate holds
    meter.on_bytes(1, 1000, now=t + 0.005)
    assert meter.next_deadline() == pytest.approx(t + 0.01)
    # a driver that never says how many are under way: every window is `interval`
    plain = RateMeter(interval=0.005, lone_interval=0.02)
    for i in range(3):
        plain.on_bytes(1, 1000, now=i * 0.005)
        plain.sample(now=(i + 1) * 0.005)
    assert plain.next_deadline() == pytest.approx(0.02)


def test_rate_meter_errors() -> None:
    with pytest.raises(ValueError, match="interval=0"):
        RateMeter(0)
    with pytest.raises(ValueError, match=r"lone_interval=0.001 must be a finite duration >= "):
        RateMeter(0.005, lone_interval=0.001)
    with pytest.raises(ValueError, match="lone_interval=inf"):
        RateMeter(0.005, lone_interval=float("inf"))
    with pytest.raises(ValueError, match="steady=1"):
        RateMeter(0.005, steady=1.0)
    with pytest.raises(ValueError, match="claim_hold=-1"):
        RateMeter(0.1, claim_hold=-1)
    m = RateMeter(0.1)
    with pytest.raises(ValueError, match="src=-1"):
        m.on_bytes(-1, 10, now=0.0)
    with pytest.raises(ValueError, match="nbytes=-10"):
        m.on_bytes(1, -10, now=0.0)
    with pytest.raises(ValueError, match="equal length"):
        m.on_batch(np.array([1, 2]), np.array([1]), now=0.0)


def test_sources_one_after_the_other_are_told_their_own_rates() -> None:
    """A driver that says how many sources have messages under way, and when: a
    window with two sources that never had messages under way at once (a
    halving-doubling rank's partners, one after the other) is not shared, nor is
    one in which they did only briefly (a partner one step ahead, whose message
    opens as the other's completes); one in which they did for at least half the
    time any did is, and so is the next window while they still do."""
    meter = RateMeter(interval=0.1, **NO_STEP)
    meter.senders_under_way(1, now=0.0)  # partner 1's message
    meter.on_bytes(1, 1000, now=0.0)
    meter.senders_under_way(0, now=0.04)  # ... completed
    meter.senders_under_way(1, now=0.05)  # partner 2's
    meter.on_bytes(2, 3000, now=0.05)
    assert meter.sample(now=0.1) == {1: pytest.approx(1e4), 2: pytest.approx(3e4)}
    assert not meter.shared
    meter.senders_under_way(2, now=0.1)  # both at once (an incast's pushes)
    meter.on_bytes(1, 1000, now=0.1)
    meter.on_bytes(2, 3000, now=0.15)
    meter.senders_under_way(1, now=0.19)
    assert meter.sample(now=0.2) == {1: pytest.approx(2e4), 2: pytest.approx(2e4)}
    assert meter.shared
    meter.senders_under_way(2, now=0.2)
    meter.on_bytes(1, 1000, now=0.2)
    meter.on_bytes(2, 1000, now=0.25)
    assert meter.sample(now=0.3) == {1: pytest.approx(1e4), 2: pytest.approx(1e4)}
    assert meter.shared  # (both under way all through)
    meter.on_bytes(1, 1000, now=0.3)  # a window that opened with both under way
    meter.senders_under_way(1, now=0.36)  # ... for more than half of it
    meter.on_bytes(2, 1000, now=0.35)
    meter.sample(now=0.4)
    assert meter.shared
    meter.on_bytes(1, 1000, now=0.4)  # one under way all through: not shared
    meter.on_bytes(2, 1000, now=0.45)
    meter.sample(now=0.5)
    assert not meter.shared
    meter.on_bytes(1, 1000, now=0.5)  # partner 2 a step ahead: a brief overlap
    meter.senders_under_way(2, now=0.55)
    meter.on_bytes(2, 1000, now=0.55)
    meter.senders_under_way(1, now=0.56)  # partner 1's message completed
    assert meter.sample(now=0.6) == {1: pytest.approx(1e4), 2: pytest.approx(1e4)}
    assert not meter.shared  # (together 0.01 s of the 0.1 s any was under way)
    meter.senders_under_way(2)  # a change without a time: the latest time said (0.6)
    meter.on_bytes(1, 1000, now=0.65)
    meter.on_bytes(2, 1000, now=0.65)
    meter.sample(now=0.7)
    assert meter.shared


def test_together_must_be_a_fraction() -> None:
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="together="):
            RateMeter(0.1, together=bad)


def test_overlap_is_counted_within_the_window_only() -> None:
    """The time together is counted from the window's start: a window that closed
    (nothing came) and opened again does not count the time between; an overlap
    of 40 % is not shared; a change said without a time is taken at the latest
    time a call said, bytes included; a time that is not finite is refused."""
    meter = RateMeter(interval=0.1, **NO_STEP)
    meter.senders_under_way(2, now=0.0)
    meter.on_bytes(1, 1000, now=0.0)
    meter.on_bytes(2, 1000, now=0.05)
    meter.sample(now=0.1)
    assert meter.shared
    assert meter.sample(now=0.2) == {}  # nothing came: the window closes
    meter.on_bytes(1, 1000, now=0.3)  # it opens again, both still under way ...
    meter.on_bytes(2, 1000, now=0.3)
    meter.senders_under_way(1, now=0.33)  # ... for 0.03 s of its 0.1
    meter.sample(now=0.4)
    assert not meter.shared  # (counted from 0.2 it would be 0.13 of 0.2)
    meter.senders_under_way(2, now=0.4)  # together for 0.04 s of 0.1: 40 %
    meter.on_bytes(1, 1000, now=0.4)
    meter.on_bytes(2, 1000, now=0.4)
    meter.senders_under_way(1, now=0.44)
    meter.sample(now=0.5)
    assert not meter.shared
    meter.on_bytes(1, 1000, now=0.5)
    meter.on_batch(np.array([1]), np.array([1000]), now=0.56)  # the latest time said
    meter.senders_under_way(2)  # ... so together from 0.56: 40 % again
    meter.on_bytes(2, 1000, now=0.58)
    meter.sample(now=0.6)
    assert not meter.shared
    meter.on_bytes(1, 1000, now=0.6)  # still together: the whole window
    meter.on_bytes(2, 1000, now=0.6)
    meter.sample(now=0.7)
    assert meter.shared
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="now="):
            meter.senders_under_way(1, now=bad)
