"""Shared reports (RATE's SHARED flag): the receiver's window had several senders and
each is told a share of what they brought, which the pacer takes as a cap while
they share (dlcp.proto.pacing.ReceiverDrivenPacer, docs/spec.md §8); the share is
a step above what they brought while the receiver's port has room, a step below
once it is full (dlcp.proto.rate_meter.RateMeter)."""

from __future__ import annotations

import pytest

from dlcp.proto.control import RateFeedback, Stop, decode_control, encode_control
from dlcp.proto.rate_meter import RateMeter
from dlcp.proto.wire import WireError
from tests.proto.test_pacing import climb_past_the_ceiling, drain_backlogged, pacer


def test_a_shared_report_caps_whether_or_not_the_sender_was_held_back() -> None:
    lone, shared = pacer(), pacer()
    lone.on_feedback(3e5, now=0.1)  # (a sender that sent nothing in the window)
    shared.on_feedback(3e5, now=0.1, shared=True)
    assert lone.rate == 1e6
    assert shared.rate == 3e5  # the share: no gain above it


def test_a_report_that_is_not_shared_brings_the_held_rate_back() -> None:
    p = pacer()
    p.on_feedback(3e5, now=0.1, shared=True)
    p.on_feedback(1e3, now=0.105)  # alone again, a window it sent little in
    assert p.rate == 1e6
    q = pacer()
    q.on_feedback(3e5, now=0.1, shared=True)
    q.on_feedback(2e6, now=0.105)  # alone, and the receiver could take more
    assert q.rate == pytest.approx(2.5e6)


def test_the_cap_ends_share_hold_after_the_last_shared_report() -> None:
    p = pacer(share_hold=0.02)
    p.on_feedback(3e5, now=0.1, shared=True)
    p.on_feedback(3e5, now=0.115, shared=True)  # still shared: renewed
    p.allowance(now=0.13)
    assert p.rate == 3e5
    p.allowance(now=0.1351)
    assert p.rate == 1e6


def test_going_idle_ends_the_cap() -> None:
    # (a pacer that met congestion: idle, it keeps its rate rather than going back
    # to initial_rate)
    p = pacer(idle_reset=0.05, share_hold=10.0, burst_bytes=100_000)
    drain_backlogged(p, 0.0, 0.01)
    p.on_loss(0.5, 4e5, now=0.01)
    assert p.rate == pytest.approx(2e5)
    p.on_feedback(1e5, now=0.011, shared=True)
    assert p.rate == 1e5
    p.allowance(now=0.2)  # idle for longer than idle_reset
    assert p.rate == pytest.approx(2e5)


def test_a_larger_share_brings_the_held_rate_back_up_to_it_and_no_further() -> None:
    p = pacer()
    p.on_feedback(3e5, now=0.1, shared=True)
    p.on_feedback(6e5, now=0.105, shared=True)  # one of the others finished
    assert p.rate == 6e5
    p.on_feedback(4e6, now=0.11, shared=True)
    assert p.rate == 1e6  # the held rate, not the gain above the share
    drain_backlogged(p, 0.11, 0.115)
    p.on_feedback(2e6, now=0.115, shared=True)  # nothing held: a raise, to the share
    assert p.rate == 2e6


def test_after_congestion_neither_the_ceiling_nor_the_probe_lifts_a_sender_above_its_share() -> (
    None
):
    lone, shared = pacer(probe=0.05), pacer(probe=0.05)
    for p in (lone, shared):
        t = climb_past_the_ceiling(p)  # (ceiling 5e5, rate 8.4e5)
        drain_backlogged(p, t, t + 0.005)  # three senders now: a share of 3e5 each
        p.on_feedback(3e5, now=t + 0.005, shared=p is shared)
    assert lone.rate == pytest.approx(5e5)  # held at the ceiling, above the share
    assert shared.rate == 3e5


def test_loss_ends_the_cap_and_the_held_rate_is_not_given_back() -> None:
    p = pacer(burst_bytes=100_000)
    drain_backlogged(p, 0.0, 0.01)
    p.on_feedback(4e5, now=0.01, shared=True)
    p.on_loss(0.5, 4e5, now=0.012)
    cut = p.rate
    assert cut == pytest.approx(2e5)
    drain_backlogged(p, 0.012, 0.017)
    p.on_feedback(1e3, now=0.017)
    assert p.rate == cut


def _windows(
    meter: RateMeter, t: float, per_source: dict[int, int], n: int
) -> tuple[float, dict[int, float]]:
    rates: dict[int, float] = {}
    for _ in range(n):
        for src, nbytes in per_source.items():
            meter.on_bytes(src, nbytes, now=t)
        t += 0.005
        rates = meter.sample(now=t)
    return t, rates


def test_the_meter_says_which_windows_were_shared() -> None:
    meter = RateMeter(interval=0.005)
    t, rates = _windows(meter, 0.0, {1: 10_000}, 1)
    assert rates == {1: pytest.approx(2e6)} and not meter.shared
    t, rates = _windows(meter, t, {1: 10_000, 2: 30_000}, 1)
    assert meter.shared and rates.keys() == {1, 2} and rates[1] == rates[2]


def test_shares_step_below_what_came_while_the_port_is_full_and_above_it_with_room() -> None:
    meter = RateMeter(interval=0.005)
    # two sources bring 1 MB/s each, window after window: the most the receiver has
    # seen, so the port in front is taken to be full, and each is told 1 % less
    t, rates = _windows(meter, 0.0, {1: 5_000, 2: 5_000}, 10)
    assert rates == {1: pytest.approx(0.99e6), 2: pytest.approx(0.99e6)}
    # they bring half as much (the smoothed total falls below 97 % of the peak
    # within a few windows): the port had room, each may bring 5 % more
    t, rates = _windows(meter, t, {1: 2_500, 2: 2_500}, 10)
    assert rates == {1: pytest.approx(0.525e6), 2: pytest.approx(0.525e6)}
    # the peak decays (0.2 % a window): after long enough at the lower rate, that is
    # the most the port carries
    t, rates = _windows(meter, t, {1: 2_500, 2: 2_500}, 400)
    assert rates == {1: pytest.approx(0.495e6), 2: pytest.approx(0.495e6)}
    # a lone source is told what it brought (no step)
    t, rates = _windows(meter, t, {1: 2_500}, 1)
    assert rates == {1: pytest.approx(0.5e6)} and not meter.shared


@pytest.mark.parametrize(
    ("option", "value"), [("share_probe", -0.1), ("share_drain", 1.0), ("saturated", 1.5)]
)
def test_the_meter_refuses_a_step_outside_0_1_by_name(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"{option}={value}"):
        RateMeter(0.005, **{option: value})


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("key", [None, b"k" * 32])
def test_rate_s_shared_flag_round_trips(shared: bool, key: bytes | None) -> None:
    msg = RateFeedback(0, 0, 3, bytes_per_s=123_456, interval_us=5000, shared=shared)
    raw = encode_control(msg, job=7, key=key, nonce=1 if key else None)
    assert raw[1] & 0x01 == shared
    assert decode_control(raw, job=7, key=key) == msg


def test_the_shared_flag_on_another_control_type_is_a_reserved_bit() -> None:
    raw = bytearray(encode_control(Stop(1, 2, 3, received_elems=10), job=7))
    raw[1] |= 0x01
    with pytest.raises(WireError, match="reserved bits set in control header: flags=0x01"):
        decode_control(bytes(raw), job=7)
