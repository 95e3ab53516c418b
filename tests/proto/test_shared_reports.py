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


def _send_all(tx: Session, rx: Session, now: float, *, keep: int = 0) -> None:
    """Hand ``tx``'s datagrams to ``rx``, all but the last ``keep`` data batches."""
    items = tx.datagrams_to_send(now=now, max_batches=1024)
    batches = [i for i in items if isinstance(i, DataBatch)]
    for item in batches[: len(batches) - keep]:
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
