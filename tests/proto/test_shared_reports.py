"""Which rate reports a receiver flags SHARED, with sessions: senders whose
messages are under way at the same time share the receiver (an incast), senders
that come one after the other do not (a halving-doubling rank's partners).

Two sender sessions and a receiver, datagrams carried by hand; the receiver's RATE
reports are read off what it sends after its rate window is due."""

from __future__ import annotations

import numpy as np

from dlcp.proto.control import RateFeedback, decode_control
from dlcp.proto.events import ControlDatagram, DataBatch
from dlcp.proto.session import Session
from tests.proto.session_helpers import JOB, config

N = 4096  # float32 elements a message: several datagrams of 256 bytes


def _send_all(tx: Session, rx: Session, now: float, *, keep: int = 0) -> list[DataBatch]:
    """Hand ``tx``'s datagrams to ``rx``, all but the last ``keep`` data batches,
    which are returned (for :func:`_deliver`)."""
    items = tx.datagrams_to_send(now=now, max_batches=1024)
    batches = [i for i in items if isinstance(i, DataBatch)]
    _deliver(batches[: len(batches) - keep], rx, now)
    return batches[len(batches) - keep :]


def _deliver(batches: list[DataBatch], rx: Session, now: float) -> None:
    for item in batches:
        rx.receive_batch(np.frombuffer(item.data, dtype=np.uint8), item.segment_size, now=now)


def _reports(rx: Session, now: float) -> dict[int, bool]:
    """The RATE reports ``rx`` sends once its window is due at ``now``: source ->
    SHARED."""
    rx.handle_timer(now=now)
    out = {}
    for item in rx.datagrams_to_send(now=now, max_batches=64):
        if isinstance(item, ControlDatagram):
            ctrl = decode_control(item.data, job=JOB)
            if isinstance(ctrl, RateFeedback):
                out[item.dst] = ctrl.shared
    return out


def _setup() -> tuple[Session, Session, Session, np.ndarray]:
    cfg = config(pacer="unpaced", batch_packets=8)  # (a message in 8 data batches)
    rx, a, b = (Session(rank=r, job=JOB, config=cfg) for r in (0, 1, 2))
    return rx, a, b, np.random.default_rng(3).standard_normal(N).astype(np.float32)


def test_senders_one_after_the_other_get_their_own_rates() -> None:
    rx, a, b, data = _setup()
    out_a, out_b = np.empty_like(data), np.empty_like(data)
    rx.expect_message(1, step=0, msg=0, out=out_a)
    rx.expect_message(2, step=0, msg=0, out=out_b)
    a.send_message(0, data, step=0, msg=0, now=0.0, p=0.0)
    _send_all(a, rx, 0.0)  # a's message whole: it completes
    assert np.array_equal(out_a, data)
    b.send_message(0, data, step=0, msg=0, now=0.001, p=0.0)
    _send_all(b, rx, 0.001)  # then b's
    assert np.array_equal(out_b, data)
    assert _reports(rx, 0.01) == {1: False, 2: False}


def test_senders_with_messages_under_way_together_share() -> None:
    rx, a, b, data = _setup()
    rx.expect_message(1, step=0, msg=0, out=np.empty_like(data))
    rx.expect_message(2, step=0, msg=0, out=np.empty_like(data))
    a.send_message(0, data, step=0, msg=0, now=0.0, p=0.0)
    b.send_message(0, data, step=0, msg=0, now=0.0, p=0.0)
    _send_all(a, rx, 0.0, keep=1)  # a's message under way ...
    _send_all(b, rx, 0.001, keep=1)  # ... when b's begins
    assert _reports(rx, 0.01) == {1: True, 2: True}


def test_a_partner_one_step_ahead_does_not_share() -> None:
    """b's message opens while a's is still under way (b is a step ahead), and a's
    completes soon after: together for a tenth of the window, not shared. Before,
    any time together made the window shared, and small halving-doubling calls
    were capped at the rate of the gaps between their messages."""
    rx, a, b, data = _setup()
    out_a, out_b = np.empty_like(data), np.empty_like(data)
    rx.expect_message(1, step=0, msg=0, out=out_a)
    rx.expect_message(2, step=0, msg=0, out=out_b)
    a.send_message(0, data, step=0, msg=0, now=0.0, p=0.0)
    b.send_message(0, data, step=0, msg=0, now=0.0, p=0.0)
    a_last = _send_all(a, rx, 0.0, keep=1)  # a's message under way from 0 ...
    b_last = _send_all(b, rx, 0.004, keep=1)  # ... b's from 0.004 ...
    _deliver(a_last, rx, 0.0045)  # ... a's completes at 0.0045 ...
    _deliver(b_last, rx, 0.005)  # ... and b's at 0.005
    assert np.array_equal(out_a, data) and np.array_equal(out_b, data)
    assert _reports(rx, 0.01) == {1: False, 2: False}


def test_an_abort_ends_the_overlap_when_it_comes() -> None:
    """b's message is under way beside a's from 0.001 until its ABORT comes at
    0.009: together for most of the window, which is shared (the ABORT's time is
    when the overlap ended, not the last data's)."""
    rx, a, b, data = _setup()
    rx.expect_message(1, step=0, msg=0, out=np.empty_like(data))
    rx.expect_message(2, step=0, msg=0, out=np.empty_like(data))
    a.send_message(0, data, step=0, msg=0, now=0.0, p=0.0)
    b.send_message(0, data, step=0, msg=0, now=0.0, p=0.0)
    _send_all(a, rx, 0.0, keep=1)
    _send_all(b, rx, 0.001, keep=1)
    assert b.cancel(0, step=0, msg=0, outgoing=True)  # b gives up; its ABORT ...
    aborts = [i for i in b.datagrams_to_send(now=0.009) if isinstance(i, ControlDatagram)]
    assert aborts
    for item in aborts:
        rx.receive_datagram(item.data, now=0.009)  # ... reaches the receiver at 0.009
    assert _reports(rx, 0.01) == {1: True, 2: True}
