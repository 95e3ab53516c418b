"""What the receive side refuses: many tiny messages nobody asked for beyond the
unexpected-message budget (each open message costs its state too), and a
RESCALE fill for a uint8 message whose data is already arriving."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.proto.config import FillPolicy
from dlcp.proto.inbox import OPEN_MESSAGE_BYTES
from dlcp.proto.session import Session
from tests.unit.session_helpers import JOB, config


def _first_datagram(sender: Session, data: np.ndarray, msg: int) -> tuple[bytes, int]:
    """The first datagram of message ``msg`` (the rest are never delivered)."""
    sender.send_message(1, data, step=0, msg=msg, now=0.0)
    batches = [i for i in sender.datagrams_to_send(now=0.0, max_batches=64)
               if hasattr(i, "segment_size")]  # fmt: skip
    seg = batches[0].segment_size
    return bytes(batches[0].data)[:seg], seg


def test_tiny_unexpected_messages_are_charged_for_their_state() -> None:
    budget = 20 * OPEN_MESSAGE_BYTES
    cfg = config(max_unexpected_bytes=budget, payload_bytes=16)
    sender, receiver = Session(rank=0, job=JOB, config=cfg), Session(rank=1, job=JOB, config=cfg)
    tiny = np.ones(32, dtype=np.uint8)  # two chunks, of which only the first comes
    for msg in range(100):
        buf, seg = _first_datagram(sender, tiny, msg)
        receiver.receive_batch(np.frombuffer(buf, np.uint8), seg, now=0.0)
    opened = len(receiver._inbox._incoming)  # 32 bytes of buffer each, 3200 in all
    assert 0 < opened <= budget // OPEN_MESSAGE_BYTES, opened
    assert receiver.stats.rejected.get("unexpected_overflow", 0) >= 100 - opened


def test_rescale_of_an_arriving_uint8_message_is_refused() -> None:
    cfg = config()
    sender, receiver = Session(rank=0, job=JOB, config=cfg), Session(rank=1, job=JOB, config=cfg)
    data = np.arange(4000, dtype=np.uint8) % 250
    buf, seg = _first_datagram(sender, data, 3)
    receiver.receive_batch(np.frombuffer(buf, np.uint8), seg, now=0.0)  # it is arriving
    with pytest.raises(ValueError, match="fill='rescale' needs a floating-point message"):
        receiver.expect_message(0, step=0, msg=3, fill=FillPolicy.RESCALE)
