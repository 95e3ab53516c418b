"""A FINISH for a message the receiver already completed: answered only when repeated.

A message whose data all arrived completes before its FINISH does (FINISH travels
on the control channel, after the data); the receiver's STOP is then on its way,
and a second one would reach the sender as stale control. A FINISH the sender
repeats on its timer (its STOP never arrived) is answered again.
"""

from __future__ import annotations

import numpy as np

from dlcp.proto.control import Finish, Stop, decode_control
from dlcp.proto.events import ControlDatagram, DataBatch
from dlcp.proto.session import MessageDelivered, MessageReceived, Session
from tests.proto.session_helpers import JOB, config, sessions

T0 = 10.0


def _kinds(items: list) -> list[type]:
    return [
        type(decode_control(bytes(i.data), job=JOB, key=None, require_auth=False))
        for i in items
        if isinstance(i, ControlDatagram)
    ]


def _events(session: Session) -> list:
    out = []
    while (e := session.next_event()) is not None:
        out.append(e)
    return out


def _send_all_data(sender: Session, receiver: Session, data: np.ndarray) -> list[ControlDatagram]:
    """Message (0, 1) from rank 0 to rank 1: every data batch delivered at T0; the
    control datagrams the sender produced (its FINISH) returned, not delivered."""
    sender.send_message(1, data, step=0, msg=1, now=T0, p=0.0)
    controls = []
    while items := sender.datagrams_to_send(now=T0):  # FINISH comes after the last batch
        for item in items:
            if isinstance(item, DataBatch):
                buf = np.frombuffer(item.data, dtype=np.uint8)
                receiver.receive_batch(buf, item.segment_size, now=T0)
            else:
                controls.append(item)
    assert _kinds(controls) == [Finish]
    return controls


def test_a_finish_that_crossed_the_stop_is_not_answered_again() -> None:
    sender, receiver = sessions()
    data = np.arange(1000, dtype=np.float32)
    out = np.empty_like(data)
    receiver.expect_message(0, step=0, msg=1, out=out)
    finish = _send_all_data(sender, receiver, data)
    assert [type(e) for e in _events(receiver)] == [MessageReceived]  # complete on data
    stop = receiver.datagrams_to_send(now=T0)
    assert _kinds(stop) == [Stop]
    receiver.receive_datagram(finish[0].data, now=T0 + 0.001)  # the crossing FINISH
    assert receiver.datagrams_to_send(now=T0 + 0.001) == []  # no second STOP
    sender.receive_datagram(stop[0].data, now=T0 + 0.002)
    assert [type(e) for e in _events(sender)] == [MessageDelivered]
    assert sender.stats.stale_control == 0
    np.testing.assert_array_equal(out, data)


def test_a_repeated_finish_is_answered_with_stop() -> None:
    cfg = config()
    sender, receiver = sessions(cfg=cfg)
    data = np.arange(1000, dtype=np.float32)
    receiver.expect_message(0, step=0, msg=1, out=np.empty_like(data))
    finish = _send_all_data(sender, receiver, data)
    _events(receiver)
    assert _kinds(receiver.datagrams_to_send(now=T0)) == [Stop]  # ... and it is lost
    receiver.receive_datagram(finish[0].data, now=T0 + 0.001)
    assert receiver.datagrams_to_send(now=T0 + 0.001) == []
    # the sender hears nothing and repeats its FINISH on its timer
    later = T0 + cfg.finish_timeout + 0.001
    assert sender.get_timer() is not None and sender.get_timer() <= later
    sender.handle_timer(now=later)
    again = sender.datagrams_to_send(now=later)
    assert _kinds(again) == [Finish]
    receiver.receive_datagram(again[0].data, now=later)
    answer = receiver.datagrams_to_send(now=later)
    assert _kinds(answer) == [Stop]
    sender.receive_datagram(answer[0].data, now=later)
    assert [type(e) for e in _events(sender)] == [MessageDelivered]
