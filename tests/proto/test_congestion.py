"""A round's loss reaches the sender's pacer (congestion), through two sessions.

The pacer's own rules are in test_pacing.py; here: which rounds count, what
rate they were sent at, and that the sender then cuts its batches shorter."""

from __future__ import annotations

import pytest

from dlcp.linkemu import LossyLink
from dlcp.proto.events import DataBatch
from dlcp.proto.outbox import LOSS_SIGNAL_CHUNKS
from dlcp.proto.pacing import MIN_BURST, ReceiverDrivenPacer
from dlcp.proto.session import Session
from dlcp.proto.wire import DATA_HEADER_LEN
from tests.proto.session_helpers import (
    CHUNK,
    config,
    gradient,
    is_data,
    is_droppable,
    is_retransmit,
    only_delivered,
    seq_of,
    sessions,
)

BURST = 32 * 1024
Loss = tuple[float, float, float, float, bool]
RATE = 2e6  # bytes/s: a 64 KB message takes ~30 ms to send


def paced_pair(p: float = 0.0) -> list[Session]:
    cfg = config(
        pacer_options={"initial_rate": RATE, "min_rate": 1e4, "burst_bytes": BURST},
        default_p=p,
    )
    return sessions(cfg=cfg)


def pacer_of(s: Session, dst: int = 1) -> ReceiverDrivenPacer:
    pacer = s._outbox.peers[dst].pacer
    assert isinstance(pacer, ReceiverDrivenPacer)
    return pacer


def send_with_round0_drops(
    every: int, n: int = 16_000, p: float = 0.0, *, only_droppable: bool = False
) -> tuple[Session, int, int]:
    """Send ``n`` float32 (250 chunks) dropping every ``every``-th first-round data
    packet (of the drop-eligible ones only, if asked); returns the sender, how
    many packets were dropped and how many it sent again."""
    a, b = paced_pair(p)
    a.send_message(1, gradient(n, 3), step=1, msg=1, now=0.0)
    resent = dropped = 0

    def drop(d: bytes) -> bool:
        nonlocal resent, dropped
        if not is_data(d):
            return False
        if is_retransmit(d):
            resent += 1
            return False
        if seq_of(d) % every or (only_droppable and not is_droppable(d)):
            return False
        dropped += 1
        return True

    link = LossyLink([a, b], seed=1, drop_filter=drop)
    link.run()
    only_delivered(link)
    return a, dropped, resent


@pytest.fixture
def losses(monkeypatch: pytest.MonkeyPatch) -> list[Loss]:
    """Every ``on_loss`` a pacer is given: (lost fraction, round rate, the pacer's
    rate before, and after, whether the loss was a queue's)."""
    seen: list[Loss] = []
    real = ReceiverDrivenPacer.on_loss

    def spy(
        self: ReceiverDrivenPacer, lost: float, rate: float, *, now: float, queue: bool = False
    ) -> None:
        before = self.rate
        real(self, lost, rate, now=now, queue=queue)
        seen.append((lost, rate, before, self.rate, queue))

    monkeypatch.setattr(ReceiverDrivenPacer, "on_loss", spy)
    return seen


def test_a_round_that_lost_a_third_slows_the_pacer_and_shortens_its_bursts(
    losses: list[Loss],
) -> None:
    a, dropped, resent = send_with_round0_drops(every=3)
    assert dropped == resent == 84  # the NACK named the lost third (seq 0, 3, ..., 249)
    ((lost, round_rate, before, after, _),) = losses  # round 0 only: round 1 lost nothing
    assert lost == pytest.approx(84 / 250)
    # the round went out in paced batches: its rate is the pacer's (feedback may
    # have raised it from RATE), not more
    assert RATE * 0.95 <= round_rate <= before * 1.0001
    assert after == pytest.approx(0.9 * (1 - lost) * round_rate)
    assert pacer_of(a).burst < BURST


def test_a_round_within_the_tolerance_leaves_the_pacer_alone(
    losses: list[Loss],
) -> None:
    a, _, _ = send_with_round0_drops(every=50)  # 2 %: random loss, not congestion
    # (seq 0, 50, ..., 200: protected chunks among them, as random loss takes them)
    assert [(lost, queue) for lost, *_, queue in losses] == [(pytest.approx(5 / 250), False)]
    assert pacer_of(a).burst == BURST


def test_drop_eligible_chunks_lost_below_the_tolerance_are_a_queue_s_loss(
    losses: list[Loss],
) -> None:
    # one in 40 of the drop-eligible chunks dropped, p = 0.1: the STOP says 2-3 %
    # of the elements are missing, below the 5 % tolerance, and all drop-eligible
    a, dropped, resent = send_with_round0_drops(every=40, p=0.1, only_droppable=True)
    assert resent == 0 and dropped > 0
    ((lost, _, before, after, queue),) = losses
    assert lost == pytest.approx(dropped * 64 / 16_000) and lost < 0.05
    assert queue and after < before
    assert pacer_of(a).burst < BURST  # cautious, as after any congestion


def test_a_stop_after_finish_reports_what_the_bound_gave_up(
    losses: list[Loss],
) -> None:
    # p = 0.1 absorbs the drop-eligible chunks dropped (one in 10 of them): no NACK;
    # the receiver's STOP (after FINISH) says how much arrived, and the loss is
    # above the 5 % tolerance
    a, dropped, resent = send_with_round0_drops(every=10, p=0.1, only_droppable=True)
    assert resent == 0 and dropped * 64 > 0.05 * 16_000
    assert [lost for lost, *_ in losses] == [pytest.approx(dropped * 64 / 16_000)]
    assert pacer_of(a).burst < BURST


def test_a_short_round_says_nothing(losses: list[Loss]) -> None:
    a, _, resent = send_with_round0_drops(every=3, n=64 * (LOSS_SIGNAL_CHUNKS - 1))
    assert resent > 0 and losses == []
    assert pacer_of(a).burst == BURST


def test_a_round_sent_at_once_counts_as_sent_at_the_pacers_rate(
    losses: list[Loss],
) -> None:
    _, dropped, _ = send_with_round0_drops(every=3, n=64 * 100)  # one batch: 100 chunks
    ((lost, round_rate, before, after, _),) = losses
    assert lost == pytest.approx(dropped / 100)
    assert round_rate == before == RATE  # no feedback came before the NACK
    assert after == pytest.approx(0.9 * (1 - lost) * RATE)


def test_batches_are_cut_to_the_pacers_burst() -> None:
    stride = CHUNK + DATA_HEADER_LEN
    a, _ = paced_pair()
    a.send_message(1, gradient(16_000, 4), step=1, msg=1, now=0.0)
    out = a.datagrams_to_send(now=0.0, max_batches=1)
    assert sum(t.count for t in out if isinstance(t, DataBatch)) == BURST // stride
    a.send_message(1, gradient(16_000, 5), step=1, msg=2, now=1.0)
    pacer_of(a).on_loss(0.5, 1e6, now=1.0)  # congested: a burst is MIN_BURST now
    out = a.datagrams_to_send(now=1.0, max_batches=1)
    assert sum(t.count for t in out if isinstance(t, DataBatch)) == MIN_BURST // stride
