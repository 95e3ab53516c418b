"""What the receive side refuses: many tiny messages nobody asked for beyond the
unexpected-message budget (each open message costs its state too), and a
RESCALE fill for a uint8 message whose data is already arriving."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.proto.config import FillPolicy
from dlcp.proto.control import Abort, AbortReason, decode_control
from dlcp.proto.inbox import OPEN_MESSAGE_BYTES
from dlcp.proto.session import Session
from tests.proto.session_helpers import JOB, config


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


def _deliver(sender: Session, receiver: Session, now: float = 0.0) -> list[bytes]:
    """``sender``'s data into ``receiver``, and ``receiver``'s control back; the
    sender's control messages (its FINISHes) are returned, not delivered."""
    held = []
    for item in sender.datagrams_to_send(now=now, max_batches=10_000):
        if hasattr(item, "segment_size"):
            receiver.receive_batch(np.frombuffer(bytes(item.data), np.uint8),
                                   item.segment_size, now=now)  # fmt: skip
        else:
            held.append(item.data)
    for item in receiver.datagrams_to_send(now=now, max_batches=10_000):
        if not hasattr(item, "segment_size"):
            sender.receive_datagram(item.data, now=now)
    return held


def _events(s: Session) -> list[object]:
    out = []
    while (e := s.next_event()) is not None:
        out.append(e)
    return out


def test_completed_messages_nobody_claimed_stay_charged_and_one_past_the_limit_is_refused() -> (
    None
):
    """Messages nobody asked for count against max_unexpected_bytes until they are
    claimed (released), not only while they arrive: the one that would pass the
    limit is refused, its sender hears why (ABORT UNCLAIMED_LIMIT) and fails it,
    and it is never reported delivered."""
    from dlcp.proto.session import MessageDelivered, MessageFailed, MessageReceived

    data = np.arange(10_000, dtype=np.float32)  # 40,000 bytes
    each = data.nbytes + OPEN_MESSAGE_BYTES
    cfg = config(max_unexpected_bytes=3 * each, pacer="unpaced")
    sender, receiver = Session(rank=0, job=JOB, config=cfg), Session(rank=1, job=JOB, config=cfg)
    for msg in range(3):
        sender.send_message(1, data, step=0, msg=msg, now=0.0)
        _deliver(sender, receiver)
    got = _events(receiver)
    assert [type(e) for e in got] == [MessageReceived] * 3
    assert [type(e) for e in _events(sender)] == [MessageDelivered] * 3
    sender.send_message(1, data, step=0, msg=3, now=0.0)  # the fourth does not fit
    (finish,) = _deliver(sender, receiver)
    (refused,) = _events(receiver)
    assert isinstance(refused, MessageFailed) and refused.msg == 3 and not refused.outgoing
    assert "past max_unexpected_bytes=123072" in refused.reason, refused.reason
    (failed,) = _events(sender)
    assert isinstance(failed, MessageFailed) and failed.outgoing and failed.msg == 3
    assert "rank 1 refused the message (unclaimed_limit)" in failed.reason, failed.reason
    assert "max_unexpected_bytes" in failed.reason
    # its FINISH, repeated (the ABORT lost with a reset connection), hears the same
    receiver.receive_datagram(finish, now=1.0)
    (again,) = receiver.datagrams_to_send(now=1.0)
    abort = decode_control(again.data, job=JOB)
    assert isinstance(abort, Abort) and abort.reason is AbortReason.UNCLAIMED_LIMIT
    assert abort.by_receiver and abort.msg == 3
    # the application claims one: its bytes are free again, and the next one fits
    receiver.release(0, step=0, msg=0)
    sender.send_message(1, data, step=0, msg=4, now=0.0)
    _deliver(sender, receiver)
    assert [type(e) for e in _events(receiver)] == [MessageReceived]
    assert [type(e) for e in _events(sender)] == [MessageDelivered]


def test_a_message_asked_for_is_not_charged_once_complete() -> None:
    from dlcp.proto.session import MessageReceived

    data = np.arange(10_000, dtype=np.float32)
    cfg = config(max_unexpected_bytes=data.nbytes + OPEN_MESSAGE_BYTES, pacer="unpaced")
    sender, receiver = Session(rank=0, job=JOB, config=cfg), Session(rank=1, job=JOB, config=cfg)
    for msg in range(3):  # each asked for (without out=: charged only while arriving)
        receiver.expect_message(0, step=0, msg=msg)
        sender.send_message(1, data, step=0, msg=msg, now=0.0)
        _deliver(sender, receiver)
        assert [type(e) for e in _events(receiver)] == [MessageReceived]
    assert receiver._inbox._unexpected_bytes == 0
