"""The native engine's pacer is a port of ``dlcp.proto.pacing.ReceiverDrivenPacer``:
driven by the same calls, at the same times, it gives the same answers, to the
bit (the same IEEE operations in the same order; no fused multiply-add on the
default x86-64 and AArch64 builds), so the engine paces exactly as the Python
engine does. Random call sequences cover the token bucket, late wake-ups,
feedback with and without backlog, shared reports' caps and what ends them, loss (a
queue's too) and the cautious phase with its ceiling, idle reset."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from dlcp.io.engine import native_available
from dlcp.io.extensions import load
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.pacers import make_pacer
from dlcp.proto.pacing import ReceiverDrivenPacer

pytestmark = pytest.mark.skipif(not native_available(), reason="native engine not built")


def _native(**options: Any) -> Any:
    _engine = load("_engine")  # (make sanitize: the build it names)

    return _engine.Pacer(**options)


def _state(p: Any) -> tuple[float, int, float]:
    return (p.rate, p.burst, p.tokens)


OPTIONS = [
    ProtocolConfig().pacer_kwargs(),  # the endpoint's defaults
    {"initial_rate": 1e6, "min_rate": 1e4, "burst_bytes": 20_000, "max_lateness": 0.0},
    {"initial_rate": 5e7, "min_rate": 1e5, "max_rate": 1e8, "burst_bytes": 65536,
     "gain": 1.1, "idle_reset": 0.05, "probe": 0.2, "probe_interval": 0.001,
     "cautious_burst": 0.0005, "loss_tolerance": 0.02},
    # the native engine's default: bursts of 200 us at the rate
    {**ProtocolConfig().pacer_kwargs(), "burst_time": 0.0002},
    {"initial_rate": 2e7, "min_rate": 1e4, "burst_bytes": 1 << 20, "burst_time": 0.003,
     "cautious_burst": 0.01},
    # a ceiling that never rises, and one that rises fast
    {**ProtocolConfig().pacer_kwargs(), "burst_time": 0.0002, "ceiling_step": 0.0},
    {"initial_rate": 3e7, "min_rate": 1e5, "burst_bytes": 65536, "ceiling_step": 0.2,
     "probe": 0.1, "probe_interval": 0.001},
    # a shared report's cap that ends within a millisecond, and one that never ends
    {**ProtocolConfig().pacer_kwargs(), "burst_time": 0.0002, "share_hold": 0.001},
    {"initial_rate": 2e7, "min_rate": 1e4, "burst_bytes": 65536, "share_hold": 1e9},
]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("seed", range(12))
def test_same_answers_as_the_python_pacer(options: dict[str, Any], seed: int) -> None:
    rng = random.Random(seed)
    py, c = ReceiverDrivenPacer(**options), _native(**options)
    now = rng.uniform(0, 100)
    for step in range(600):
        now += rng.choice([0.0, 1e-6, 1e-4, 4e-4, 1e-3, 3e-3, 0.02, 0.3, 2.0])
        op = rng.randrange(7)
        nbytes = rng.choice([0, 1, 1472, 64_000, 518_144, 3_000_000])
        what = f"seed {seed} step {step} op {op}"
        if op == 0:
            assert py.next_send_time(nbytes, now=now) == c.next_send_time(nbytes, now=now), what
        elif op == 1:
            py.on_sent(nbytes, now=now)
            c.on_sent(nbytes, now=now)
        elif op == 2:
            assert py.allowance(now=now) == c.allowance(now=now), what
        elif op == 3:
            rate = rng.choice([0.0, 1e3, 1e6, 5e7, 1e9, 3e9])
            shared = rng.random() < 0.4  # (a window several senders shared)
            # (the window it measured: unknown, one probe step, a lone receiver's
            # several, more than MAX_PROBE_STEPS)
            window = rng.choice([0.0, 0.001, 0.005, 0.02, 0.3])
            py.on_feedback(rate, now=now, shared=shared, window=window)
            c.on_feedback(rate, now=now, shared=shared, window=window)
        elif op == 4:
            lost, at = rng.choice([0.0, 0.01, 0.1, 0.5, 1.0]), rng.choice([1e5, 1e7, 1e9])
            if rng.random() < 0.5:  # a queue's loss (queue_signal), or one of either class
                queue = rng.random() < 0.5
                py.on_loss(lost, at, now=now, queue=queue)
                c.on_loss(lost, at, now=now, queue=queue)
            else:
                py.on_loss(lost, at, now=now)
                c.on_loss(lost, at, now=now)
        elif op == 5:
            py.note_backlogged(now=now)
            c.note_backlogged(now=now)
        else:  # a send that the pacer allowed, as a sender would make it
            t = py.next_send_time(nbytes, now=now)
            assert t == c.next_send_time(nbytes, now=now), what
            if t <= now:
                py.on_sent(nbytes, now=now)
                c.on_sent(nbytes, now=now)
        assert _state(py) == _state(c), what


def test_unpaced_never_waits() -> None:
    c = _native(unpaced=True)
    assert math.isinf(c.rate)
    assert c.next_send_time(10**9, now=5.0) == 5.0
    c.on_sent(10**9, now=5.0)
    assert c.next_send_time(10**9, now=5.0) == 5.0
    assert c.burst == make_pacer("unpaced").burst


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: p.on_sent(-1, now=0.0), "nbytes"),
        (lambda p: p.next_send_time(10, now=math.nan), "now"),
        (lambda p: p.on_feedback(-5.0, now=0.0), "bytes_per_s"),
        (lambda p: p.on_feedback(1e6, now=0.0, window=-1.0), "window"),
        (lambda p: p.on_loss(1.5, 1e6, now=0.0), "lost_fraction"),
        (lambda p: p.on_loss(0.5, 0.0, now=0.0), "send_rate"),
    ],
)
def test_bad_arguments_are_refused_by_name(call: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(_native(**OPTIONS[0]))


def test_on_loss_and_on_feedback_need_now_as_the_python_pacer_does() -> None:
    for p in (_native(**OPTIONS[0]), ReceiverDrivenPacer(**OPTIONS[0])):
        with pytest.raises(TypeError, match="now"):
            p.on_loss(0.5, 1e6)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="now"):
            p.on_feedback(1e6, shared=True)  # type: ignore[call-arg]
