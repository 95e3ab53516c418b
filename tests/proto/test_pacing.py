"""Rate control: the token-bucket pacer driven by receiver feedback (with the rate
meter of tests/proto/test_rate_meter.py in its closed loops)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcp.proto.pacers import Unpaced, available_pacers, make_pacer
from dlcp.proto.pacing import (
    MAX_PROBE_STEPS,
    MIN_BURST,
    UNLIMITED,
    ReceiverDrivenPacer,
    queue_signal,
)
from dlcp.proto.rate_meter import RateMeter

PKT = 1452


def pacer(**kw: float) -> ReceiverDrivenPacer:
    opts: dict[str, float] = {
        "initial_rate": 1e6,
        "min_rate": 1e4,
        "max_rate": 1e8,
        "burst_bytes": 10_000,
    }
    opts.update(kw)
    return ReceiverDrivenPacer(**opts)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- unpaced


def test_unpaced_always_allows() -> None:
    p = Unpaced()
    assert p.rate == math.inf
    assert p.allowance(now=0.0) == UNLIMITED
    p.on_sent(10**9, now=0.0)
    assert p.allowance(now=0.0) == UNLIMITED
    assert p.next_send_time(10**9, now=3.5) == 3.5
    p.on_feedback(1.0, now=4.0)
    assert p.rate == math.inf


# --------------------------------------------------------------------------- token bucket


def test_bucket_starts_full_and_caps_at_one_burst() -> None:
    p = pacer()
    assert p.allowance(now=0.0) == 10_000
    assert p.allowance(now=100.0) == 10_000  # idle for long: still one burst
    p.on_sent(10_000, now=100.0)
    assert p.allowance(now=100.0) == 0
    assert p.allowance(now=100.005) == 5_000  # 1e6 B/s * 5 ms


def test_packet_sender_long_run_matches_rate() -> None:
    p = pacer()
    t, sent, end = 0.0, 0, 10.0
    while True:
        t = p.next_send_time(PKT, now=t)
        if t > end:
            break
        p.on_sent(PKT, now=t)
        sent += PKT
    expected = 1e6 * end + 10_000  # rate * time plus the initial burst
    assert abs(sent - expected) / expected < 0.01


def test_allowance_sender_long_run_matches_rate() -> None:
    # polls at irregular times more often than a burst lasts: no allowance is wasted
    p = pacer(initial_rate=3e6, burst_bytes=64_000)
    rng = np.random.default_rng(7)
    times = np.cumsum(rng.uniform(0.0, 0.004, 5000))
    sent = 0
    for t in times:
        n = p.allowance(now=float(t))
        p.on_sent(n, now=float(t))
        sent += n
    expected = 3e6 * float(times[-1]) + 64_000
    assert abs(sent - expected) / expected < 0.01


def test_a_driver_waking_on_a_millisecond_grid_still_gets_the_rate() -> None:
    # rate 2 GB/s, burst 512 KB: a burst lasts 0.26 ms, but the driver's timer
    # (epoll) fires on whole milliseconds. Tokens earned while it was late are
    # kept, so the sender still gets the rate, not one burst per millisecond.
    rate, burst, batch = 2e9, 1 << 19, 352 * 1472
    p = ReceiverDrivenPacer(rate, 1e6, burst_bytes=burst)
    t, sent, end = 0.0, 0, 0.2
    while t < end:
        when = p.next_send_time(batch, now=t)
        if when > t:
            t = math.ceil(when * 1e3 - 1e-9) / 1e3  # the next millisecond tick
            continue
        p.on_sent(batch, now=t)
        sent += batch
    assert sent / end > 0.95 * rate, sent / end / 1e9
    # without the lateness allowance it would be about one burst per tick
    q = ReceiverDrivenPacer(rate, 1e6, burst_bytes=burst, max_lateness=0.0)
    t, sent = 0.0, 0
    while t < end:
        when = q.next_send_time(batch, now=t)
        if when > t:
            t = math.ceil(when * 1e3 - 1e-9) / 1e3
            continue
        q.on_sent(batch, now=t)
        sent += batch
    assert sent / end < 0.3 * rate, sent / end / 1e9


def test_overdraft_is_paid_back() -> None:
    p = pacer()
    p.on_sent(30_000, now=0.0)  # one batch larger than the allowance
    assert p.allowance(now=0.0) == 0
    # debt of 20_000 plus one packet at 1e6 B/s
    assert p.next_send_time(PKT, now=0.0) == pytest.approx((20_000 + PKT) / 1e6)


@settings(max_examples=200)
@given(
    start=st.sampled_from([0.0, 1.5, 86_400.0, 1e6]),
    rate=st.floats(1e3, 1.25e10),
    sends=st.lists(st.tuples(st.floats(0, 0.01), st.integers(0, 200_000)), max_size=8),
    n=st.integers(0, 200_000),
)
def test_next_send_time_is_consistent_with_allowance(
    start: float, rate: float, sends: list[tuple[float, int]], n: int
) -> None:
    p = ReceiverDrivenPacer(rate, rate, rate, burst_bytes=65_536)
    t = start
    for dt, size in sends:
        t += dt
        p.on_sent(min(size, p.allowance(now=t)), now=t)
    need = min(n, 65_536)
    when = p.next_send_time(n, now=t)
    if when == t:
        assert p.allowance(now=t) >= need
        return
    assert when > t
    at = copy.deepcopy(p)
    assert at.allowance(now=when) >= need
    # 1 % earlier must be short, unless that is within the pacer's rounding slack
    # (a few ulps of `now` worth of bytes: 1e6 s is only exact to ~1e-10 s)
    if 0.01 * rate * (when - t) >= 2.0 + 8.0 * rate * math.ulp(when):
        before = copy.deepcopy(p)
        assert before.allowance(now=t + 0.99 * (when - t)) < need


# --------------------------------------------------------------------------- feedback


def drain_backlogged(p: ReceiverDrivenPacer, t0: float, t1: float, step: float = 1e-4) -> float:
    """A sender with endless data from t0 to t1; returns bytes sent."""
    sent = 0
    for t in np.arange(t0, t1, step):
        n = p.allowance(now=float(t))
        if n < PKT:
            p.next_send_time(PKT, now=float(t))
            continue
        n -= n % PKT
        p.on_sent(n, now=float(t))
        sent += n
    return sent


def test_feedback_sets_rate_when_backlogged() -> None:
    p = pacer()
    drain_backlogged(p, 0.0, 0.05)
    p.on_feedback(400_000.0, now=0.05)
    assert p.rate == pytest.approx(1.25 * 400_000)
    drain_backlogged(p, 0.05, 0.1)
    p.on_feedback(1.0, now=0.1)
    assert p.rate == 1e4  # clamped to min_rate
    p.on_feedback(1e12, now=0.1)
    assert p.rate == 1e8  # increases are always taken, clamped to max_rate


def test_feedback_while_idle_does_not_collapse_rate() -> None:
    p = pacer()
    p.on_sent(PKT, now=0.0)  # a little traffic, then the sender computes
    p.on_feedback(0.0, now=0.2)
    assert p.rate == 1e6
    p.on_feedback(5_000.0, now=0.4)
    assert p.rate == 1e6


def test_feedback_after_partly_idle_interval_is_not_a_decrease() -> None:
    p = pacer()
    drain_backlogged(p, 0.0, 0.02)  # backlogged for 20 ms
    # then idle for 80 ms: the receiver measured ~1/5 of the pacing rate
    p.on_feedback(200_000.0, now=0.1)
    assert p.rate == 1e6


def test_feedback_increase_taken_even_when_not_backlogged() -> None:
    p = pacer()
    p.on_feedback(2e6, now=1.0)
    assert p.rate == pytest.approx(2.5e6)


def test_idle_reset_returns_to_initial_rate() -> None:
    p = pacer(idle_reset=0.5)
    drain_backlogged(p, 0.0, 0.05)
    p.on_feedback(100_000.0, now=0.05)
    assert p.rate == pytest.approx(125_000)
    assert p.allowance(now=0.4) > 0  # still within idle_reset
    assert p.rate == pytest.approx(125_000)
    assert p.allowance(now=0.7) == 10_000
    assert p.rate == 1e6


def test_closed_loop_follows_bottleneck() -> None:
    """Sender with endless data, a 500 kB/s bottleneck with a queue, receiver feedback."""
    capacity, step, fb_every = 500_000.0, 1e-3, 10
    p = pacer(initial_rate=2e6)
    meter = RateMeter(interval=fb_every * step)
    queue = 0.0
    for i in range(2000):
        t = i * step
        n = p.allowance(now=t)
        p.on_sent(n, now=t)
        p.note_backlogged(now=t)
        queue += n
        delivered = min(queue, capacity * step)
        queue -= delivered
        meter.on_bytes(1, int(delivered), now=t)
        if meter.due(now=t):
            for _src, r in meter.sample(now=t).items():
                p.on_feedback(r, now=t)
    assert capacity <= p.rate <= 1.25 * capacity * 1.02


def _slow_window_run(report_idle: bool) -> float:
    """A sender with endless data, paced at 10 MB/s; a receiver that could take
    100 MB/s but sees only 70 % of each window's bytes in that window (the rest
    is still in flight or lost). Returns the sender's final rate."""
    step, fb_every, capacity = 1e-3, 5, 100e6
    p = pacer(initial_rate=10e6, burst_bytes=64 * 1024)
    meter = RateMeter(interval=fb_every * step)
    for i in range(1000):
        t = i * step
        n = p.allowance(now=t)
        p.on_sent(n, now=t)
        p.note_backlogged(now=t)
        seen = int(0.7 * n)
        meter.on_bytes(1, seen, now=t)
        if report_idle:
            meter.on_idle(step - seen / capacity, now=t)  # it waits the rest of the ms
        if meter.due(now=t):
            for _src, r in meter.sample(now=t).items():
                p.on_feedback(r, now=t)
    return p.rate


def test_idle_receiver_does_not_talk_the_sender_down() -> None:
    # measured over wall time, the slow windows pull the rate down step by step
    assert _slow_window_run(report_idle=False) < 1e6
    # measured over busy time, the receiver says it could take far more
    assert _slow_window_run(report_idle=True) >= 10e6


# --------------------------------------------------------------------------- congestion


def test_loss_within_tolerance_changes_nothing() -> None:
    p = pacer(burst_bytes=100_000)
    p.on_loss(0.05, 800_000.0, now=0.0)  # a percent or two of random loss is not congestion
    assert p.rate == 1e6 and p.burst == 100_000


def test_loss_above_tolerance_falls_below_what_got_through() -> None:
    p = pacer(burst_bytes=100_000)
    p.on_loss(0.3, 800_000.0, now=0.0)
    assert p.rate == pytest.approx(800_000 * 0.9 * 0.7)  # backoff * (1 - lost) * round rate
    # a burst now holds 2 ms at the rate, but never less than MIN_BURST
    assert p.burst == MIN_BURST
    q = pacer(burst_bytes=1 << 20, initial_rate=1e8)
    q.on_loss(0.1, 5e7, now=0.0)
    assert q.burst == int(5e7 * 0.9 * 0.9 * 0.002)


def test_one_loss_at_most_halves_the_round_rate_and_never_raises() -> None:
    p = pacer()
    p.on_loss(0.9, 800_000.0, now=0.0)
    assert p.rate == pytest.approx(400_000)
    p.on_loss(0.2, 5e6, now=0.01)  # sent faster than the pacer allows (a burst): no raise
    assert p.rate == pytest.approx(400_000)
    p.on_loss(1.0, 1e3, now=0.02)
    assert p.rate == 1e4  # min_rate


def test_after_congestion_raises_are_small_spaced_steps_and_feedback_does_not_lower() -> None:
    p = pacer(probe=0.02, probe_interval=0.005)
    drain_backlogged(p, 0.0, 0.01)
    p.on_loss(0.2, 5e5, now=0.01)  # a round its CPU held at half the pacer's rate
    cut = 5e5 * 0.9 * 0.8  # (the ceiling is 1e6 * 0.9 * 0.8)
    assert p.rate == pytest.approx(cut)
    drain_backlogged(p, 0.01, 0.0101)
    p.on_feedback(1e8, now=0.0101)  # too soon after the cut
    assert p.rate == pytest.approx(cut)
    drain_backlogged(p, 0.0101, 0.016)
    p.on_feedback(1e8, now=0.016)
    assert p.rate == pytest.approx(cut * 1.02)
    p.on_feedback(1e8, now=0.017)  # feedbacks handled together make one step
    assert p.rate == pytest.approx(cut * 1.02)
    drain_backlogged(p, 0.017, 0.03)
    p.on_feedback(1e3, now=0.03)  # backlogged, a low report: ignored while cautious
    assert p.rate == pytest.approx(cut * 1.02)


def test_after_congestion_a_sender_that_was_not_held_back_is_not_raised() -> None:
    p = pacer(probe=0.05, probe_interval=0.005)
    drain_backlogged(p, 0.0, 0.01)
    p.on_loss(0.2, 5e5, now=0.01)
    p.on_feedback(1e8, now=0.01)  # (ends the interval the sender was held back in)
    cut = p.rate
    # between messages: the receiver claims much, but the sender sent nothing
    for t in (0.02, 0.03, 0.04):
        p.on_feedback(1e8, now=t)
    assert p.rate == cut
    drain_backlogged(p, 0.04, 0.05)  # the next message, held back by the pacer
    p.on_feedback(1e8, now=0.05)
    assert p.rate == pytest.approx(cut * 1.05)


def test_after_congestion_raises_stop_at_what_got_through() -> None:
    p = pacer(probe=0.05, probe_interval=0.005, ceiling_step=0.01)
    # a round measured at half the pacer's 1e6 (its CPU held it back) lost 10 %:
    # the rate falls to 4.05e5, the ceiling to 1e6 * 0.9 * 0.9
    p.on_loss(0.1, 5e5, now=0.0)
    ceiling = 8.1e5
    p.on_loss(0.0, 4e5, now=0.0)  # a whole round below the ceiling says nothing of it
    t = 0.0
    # the receiver takes 7.5e5 B/s (a step above it is below the ceiling): the pacer
    # asks for 9.375e5
    for _ in range(20):
        drain_backlogged(p, t, t + 0.005)
        t += 0.005
        p.on_feedback(7.5e5, now=t)
    assert p.rate == pytest.approx(ceiling)  # not 20 steps of 5 %
    p.on_loss(0.0, 5e5, now=t)  # a whole round at the ceiling: it goes up a step
    drain_backlogged(p, t, t + 0.005)
    p.on_feedback(7.5e5, now=t + 0.005)
    assert p.rate == pytest.approx(ceiling * 1.01)
    p.on_loss(0.3, 2e6, now=t + 0.005)  # a later loss never raises the ceiling
    drain_backlogged(p, t + 0.005, t + 0.02)
    p.on_feedback(7.5e5, now=t + 0.02)
    assert p.rate == pytest.approx(ceiling * 1.01)
    p.on_sent(PKT, now=t + 0.02)
    assert p.allowance(now=t + 2.0) > 0  # idle for longer than idle_reset ...
    drain_backlogged(p, t + 2.0, t + 2.005)
    p.on_feedback(7.5e5, now=t + 2.005)
    assert p.rate == pytest.approx(ceiling * 1.01)  # ... keeps the ceiling


def test_after_congestion_the_ceiling_does_not_hold_below_what_the_receiver_reports() -> None:
    p = pacer(probe=0.05, probe_interval=0.005, min_rate=1e4)
    # an incast's cascade of lossy rounds left this sender at a tenth of its share
    for at in (1e6, 5e5, 2.5e5, 1.25e5):
        p.on_loss(0.5, at, now=0.0)
    low = p.rate
    assert low == pytest.approx(6.25e4)
    # the receiver, shared by three senders, reports each a share of 2e5 B/s
    t, rates = 0.0, []
    for _ in range(40):
        drain_backlogged(p, t, t + 0.005)
        t += 0.005
        p.on_feedback(2e5, now=t)
        rates.append(p.rate)
    # in 5 % steps past the old ceiling, up to a step above the share (not the 2.5e5
    # the pacer asks for)
    assert rates[9] == pytest.approx(low * 1.05**10)
    assert rates[-1] == pytest.approx(2.1e5)


def test_after_congestion_a_report_over_a_longer_window_climbs_as_fast() -> None:
    """A receiver that hears from one sender reports every 20 ms (its rate meter's
    ``lone_interval``): a report measured over a window of four probe intervals
    raises four 5 % steps, so the climb takes as long as with a report every 5 ms;
    at most MAX_PROBE_STEPS, and never more steps than intervals since the last
    raise."""
    p = pacer(probe=0.05, probe_interval=0.005, min_rate=1e4)
    for at in (1e6, 5e5, 2.5e5, 1.25e5):
        p.on_loss(0.5, at, now=0.0)
    low = p.rate
    t, rates = 0.0, []
    for _ in range(10):
        drain_backlogged(p, t, t + 0.02)
        t += 0.02
        p.on_feedback(2e5, now=t, window=0.02)
        rates.append(p.rate)
    assert rates[1] == pytest.approx(low * 1.05**8)  # as 8 reports 5 ms apart
    assert rates[-1] == pytest.approx(2.1e5)
    q = pacer(probe=0.05, probe_interval=0.005, min_rate=1e4)
    q.on_loss(0.5, 1e5, now=0.0)
    low = q.rate
    drain_backlogged(q, 0.0, 1.0)
    q.on_feedback(1e7, now=1.0, window=1.0)  # a second's window: MAX_PROBE_STEPS at most
    assert q.rate == pytest.approx(low * 1.05**MAX_PROBE_STEPS)
    drain_backlogged(q, 1.0, 1.01)
    q.on_feedback(1e7, now=1.01, window=0.02)  # 10 ms since the raise: two steps
    assert q.rate == pytest.approx(low * 1.05 ** (MAX_PROBE_STEPS + 2))


def climb_past_the_ceiling(p: ReceiverDrivenPacer) -> float:
    """A loss at 0.01 s (rate 2e5, ceiling 5e5), then 30 windows alone at the port,
    held back, with reports of 8e5: the pacer ends above its ceiling, a step above
    the report. Returns the time of the last report."""
    drain_backlogged(p, 0.0, 0.01)
    p.on_loss(0.5, 4e5, now=0.01)
    t = 0.01
    for _ in range(30):
        drain_backlogged(p, t, t + 0.005)
        t += 0.005
        p.on_feedback(8e5, now=t)
    assert p.rate == pytest.approx(8.4e5)
    return t


def test_after_congestion_a_sender_above_its_ceiling_and_the_report_falls_to_them() -> None:
    p = pacer(probe=0.05, probe_interval=0.005)
    t = climb_past_the_ceiling(p)
    p.on_feedback(1e3, now=t + 0.001)  # a window the sender sent little in says nothing
    assert p.rate == pytest.approx(8.4e5)
    drain_backlogged(p, t + 0.001, t + 0.006)  # three senders again: a share of 3e5
    p.on_feedback(3e5, now=t + 0.006)
    assert p.rate == pytest.approx(5e5)  # down to the ceiling, the larger of the two
    drain_backlogged(p, t + 0.006, t + 0.011)
    p.on_feedback(1e5, now=t + 0.011)
    assert p.rate == pytest.approx(5e5)  # never below the ceiling on a report


def test_after_congestion_idle_keeps_the_rate_and_the_caution() -> None:
    p = pacer(idle_reset=0.5, burst_bytes=100_000)
    drain_backlogged(p, 0.0, 0.05)
    p.on_loss(0.6, 1e6, now=0.05)  # an incast's first round
    cut = p.rate
    assert cut == pytest.approx(5e5)
    p.on_sent(PKT, now=0.06)
    assert p.allowance(now=1.0) > 0  # idle for longer than idle_reset: the next
    assert p.rate == cut and p.burst == MIN_BURST  # message starts where this one ended
    p.on_feedback(4e6, now=1.0)  # (ends the interval the sender sent nothing in)
    assert p.rate == cut
    drain_backlogged(p, 1.0, 1.005)
    p.on_feedback(4e6, now=1.005)
    assert p.rate == pytest.approx(cut * 1.05)  # in small steps
    # a pacer that never met congestion goes back to initial_rate, as before
    q = pacer(idle_reset=0.5)
    drain_backlogged(q, 0.0, 0.05)
    q.on_feedback(1e5, now=0.05)
    assert q.rate == pytest.approx(1.25e5)
    q.on_sent(PKT, now=0.06)
    assert q.allowance(now=1.0) > 0
    assert q.rate == 1e6


def test_a_queue_s_loss_backs_off_below_the_tolerance_and_random_loss_does_not() -> None:
    random_loss, queue_loss = pacer(burst_bytes=100_000), pacer(burst_bytes=100_000)
    random_loss.on_loss(0.02, 800_000.0, now=0.0)  # both classes alike
    assert random_loss.rate == 1e6
    queue_loss.on_loss(0.02, 800_000.0, now=0.0, queue=True)  # drop-eligible only
    assert queue_loss.rate == pytest.approx(800_000 * 0.9 * 0.98)
    assert queue_loss.burst == MIN_BURST  # cautious, as after any congestion


def test_once_a_ceiling_is_known_a_queue_s_loss_cuts_the_pacer_s_own_rate() -> None:
    p = pacer(burst_bytes=100_000)
    p.on_loss(0.02, 800_000.0, now=0.0, queue=True)  # the first: of the round's rate
    rate = p.rate
    assert rate == pytest.approx(800_000 * 0.9 * 0.98)
    # a round its CPU sent at a third of the rate (in bursts at the rate) lost 2 %
    p.on_loss(0.02, rate / 3, now=0.01, queue=True)
    assert p.rate == pytest.approx(rate * 0.9 * 0.98)
    p.on_loss(0.9, 1e4, now=0.02, queue=True)  # at most halved, as any loss
    assert p.rate == pytest.approx(rate * 0.9 * 0.98 / 2)


@pytest.mark.parametrize(
    ("eligible", "protected", "queue"),
    [
        (0.02, 0.02, False),  # random loss hits both classes alike
        (0.05, 0.0126, False),  # the drop-eligible lost less than 4x as often
        (0.05, 0.0125, True),
        (0.03, 0.0, True),  # only drop-eligible chunks lost
        (0.02, 0.0, False),  # ... but too few to say
        (0.0, 0.0, False),
        (1.0, 1.0, False),
    ],
)
def test_queue_signal(eligible: float, protected: float, queue: bool) -> None:
    assert queue_signal(eligible, protected) is queue


def test_queue_signal_refuses_a_fraction_outside_0_1_by_name() -> None:
    with pytest.raises(ValueError, match=r"eligible_lost=1\.5"):
        queue_signal(1.5, 0.0)
    with pytest.raises(ValueError, match=r"protected_lost=-0\.1"):
        queue_signal(0.1, -0.1)


def test_a_cut_drops_the_tokens_saved_at_the_old_rate() -> None:
    p = pacer(initial_rate=5e7, max_rate=1e9, burst_bytes=1 << 19)
    assert p.allowance(now=1.0) == 1 << 19  # a full bucket, as after a wait for a NACK
    p.on_loss(0.3, 5e7, now=1.0)
    assert p.burst < 1 << 19
    assert p.allowance(now=1.0) == p.burst  # not the 512 KB saved before


def test_after_congestion_a_late_wake_up_adds_at_most_half_a_burst() -> None:
    p = pacer(initial_rate=2.5e7, max_rate=1e9, burst_bytes=1 << 19)
    p.on_loss(0.2, 2.5e7, now=0.0)
    burst = p.burst
    p.on_sent(p.allowance(now=0.0), now=0.0)
    due = p.next_send_time(burst, now=0.0)
    # the driver comes back 4 ms late: the bucket holds one burst and 1 ms more
    assert p.allowance(now=due + 0.004) <= burst + p.rate * p.cautious_burst / 2 + 1


def test_a_loss_that_does_not_lower_the_rate_does_not_hold_back_the_next_step() -> None:
    p = pacer(probe=0.05, probe_interval=0.005)
    p.on_loss(0.3, 5e5, now=0.0)  # cut to 3.15e5 (the ceiling: 6.3e5)
    p.on_loss(0.2, 1e6, now=0.004)  # a round sent before the cut: 7.2e5, no lower
    assert p.rate == pytest.approx(3.15e5)
    p.on_feedback(1e8, now=0.004)  # (the sender was idle until now: no step)
    assert p.rate == pytest.approx(3.15e5)
    drain_backlogged(p, 0.004, 0.005)
    p.on_feedback(1e8, now=0.005)  # the step is due 5 ms after the cut, not the report
    assert p.rate == pytest.approx(3.15e5 * 1.05)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"loss_tolerance": 0.0}, "loss_tolerance=0.0"),
        ({"backoff": 1.5}, "backoff=1.5"),
        ({"max_cut": 0.0}, "max_cut=0.0"),
        ({"probe": 0.0}, "probe=0.0"),
        ({"ceiling_step": -0.01}, "ceiling_step=-0.01"),
        ({"probe_interval": -1.0}, "probe_interval=-1.0"),
        ({"cautious_burst": math.nan}, "cautious_burst=nan"),
        ({"min_rate": 0.0}, "min_rate=0.0"),
        ({"max_rate": 1.0}, "max_rate=1.0"),
        ({"initial_rate": 1e9}, "initial_rate=1000000000.0"),
        ({"burst_bytes": 0}, "burst_bytes=0"),
        ({"max_lateness": -1.0}, "max_lateness=-1.0"),
        ({"gain": 0.0}, "gain=0.0"),
        ({"idle_reset": 0.0}, "idle_reset=0.0"),
        ({"used_fraction": 1.5}, "used_fraction=1.5"),
    ],
)
def test_pacer_bad_options(kw: dict[str, float], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        pacer(**kw)


def test_pacer_bad_calls() -> None:
    p = pacer()
    with pytest.raises(ValueError, match="nbytes=-1"):
        p.on_sent(-1, now=0.0)
    with pytest.raises(ValueError, match="now=nan"):
        p.allowance(now=float("nan"))
    with pytest.raises(ValueError, match="bytes_per_s=-5"):
        p.on_feedback(-5.0, now=0.0)
    for pacer_ in (p, Unpaced()):
        with pytest.raises(ValueError, match=r"lost_fraction=1\.5"):
            pacer_.on_loss(1.5, 1e6, now=0.0)
        with pytest.raises(ValueError, match=r"send_rate=0\.0"):
            pacer_.on_loss(0.5, 0.0, now=0.0)


def test_make_pacer() -> None:
    assert available_pacers() == ["receiver", "unpaced"]
    assert isinstance(make_pacer("unpaced"), Unpaced)
    p = make_pacer("receiver", initial_rate=1e6, min_rate=1e3)
    assert isinstance(p, ReceiverDrivenPacer) and p.rate == 1e6
    with pytest.raises(ValueError, match="unknown pacer 'tcp'; known pacers: receiver, unpaced"):
        make_pacer("tcp")
    with pytest.raises(ValueError, match="bad options for pacer 'receiver'"):
        make_pacer("receiver", initial_rate=1e6, min_rate=1e3, bogus=1)
