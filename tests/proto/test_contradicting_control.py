"""Control messages that pass the codec's checks but contradict the message they
name (docs/spec.md §6.2, after the table): dropped and counted as geometry
errors, changing nothing. A peer that sends them (a bug, or forged where the job
does not authenticate) cannot make a sender report more than it sent, nor a
receiver complete without a protected chunk."""

from __future__ import annotations

from dlcp.linkemu import LossyLink
from dlcp.proto.control import Finish, Stop, decode_control, encode_control
from dlcp.proto.session import ControlDatagram, MessageDelivered, MessageReceived
from tests.proto.session_helpers import (
    JOB,
    config,
    gradient,
    is_droppable,
    seq_of,
    sessions,
)

N = 4000


def test_a_stop_claiming_more_than_the_message_is_refused() -> None:
    a, b = sessions(2, config())
    link = LossyLink([a, b])
    a.send_message(1, gradient(N, 1), step=1, msg=0, now=0.0)
    forged = Stop(1, 0, 1, received_elems=0xFFFFFFFF)
    a.receive_datagram(encode_control(forged, job=JOB), now=0.0)
    assert a.stats.rejected == {"geometry": 1}
    link.run()  # (the message goes on, and ends as the receiver says)
    (ev,) = [e for _, e in link.events if isinstance(e, MessageDelivered)]
    assert ev.report.acknowledged_elems == ev.report.msg_elems == N


def test_a_later_finish_with_other_counts_is_refused() -> None:
    """The receiver holds the first FINISH and waits for a lost protected chunk; a
    second FINISH of the same round saying no chunk is protected must not let it
    complete without it."""
    a, b = sessions(2, config(default_p=0.2))
    a.send_message(1, gradient(N, 3), step=1, msg=0, now=0.0)
    first, lost = None, None
    for item in a.datagrams_to_send(now=0.0, max_batches=10_000):
        if isinstance(item, ControlDatagram):
            first = decode_control(bytes(item.data), job=JOB)
            continue
        raw = bytes(item.data)
        for at in range(0, len(raw), item.segment_size):
            d = raw[at : at + item.segment_size]
            if lost is None and not is_droppable(d):
                lost = seq_of(d)  # one protected chunk is lost
                continue
            b.receive_datagram(d, now=0.0)
    assert isinstance(first, Finish) and first.protected_chunks > 0 and lost is not None
    b.receive_datagram(encode_control(first, job=JOB), now=0.0)
    classes = [0] * 16
    classes[1] = first.total_chunks  # "every chunk drop-eligible"
    forged = Finish(1, 0, 0, round=0, total_chunks=first.total_chunks, protected_chunks=0,
                    class_chunks=tuple(classes))  # fmt: skip
    b.receive_datagram(encode_control(forged, job=JOB), now=0.0)
    assert b.stats.rejected == {"geometry": 1}
    b.handle_timer(now=1.0)
    assert not [e for e in b.events if isinstance(e, MessageReceived)]
    # (the real FINISH again, as a retransmission round's would repeat its counts)
    b.receive_datagram(encode_control(first, job=JOB), now=1.0)
    assert b.stats.rejected == {"geometry": 1}
