"""Session edge cases found in review, each driven through two real sessions.

* ABORT says which side abandoned a message. Two ranks that send each other a
  message of the same step and msg (a ring of two, a halving-doubling pair) have
  one key, (peer, step, msg), for both directions; an ABORT without its direction
  failed the receiver's incoming copy where the peer had abandoned the other one.
* A receive posted with a stricter bound while its message waited to complete by
  the looser one left that wait's deadline in the past: the timer stayed due and
  a driver would spin. Now the message NACKs what the stricter bound needs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dlcp.proto.config import ProtocolConfig
from dlcp.proto.control import Abort, AbortReason, Finish, decode_control, encode_control
from dlcp.proto.events import ControlDatagram, DataBatch
from dlcp.proto.recovery import chunks_in_ranges
from dlcp.proto.session import MessageDelivered, MessageFailed, MessageReceived, Session
from dlcp.proto.wire import WireError

JOB = 7


def _deliver(sessions: list[Session], items: list[object], now: float) -> None:
    for item in items:
        assert isinstance(item, DataBatch | ControlDatagram)
        peer = sessions[item.dst]
        if isinstance(item, DataBatch):
            peer.receive_batch(np.frombuffer(item.data, dtype=np.uint8), item.segment_size, now=now)
        else:
            peer.receive_datagram(item.data, now=now)


def _pump(sessions: list[Session], *, until: float) -> dict[int, list[object]]:
    """Move every datagram between the sessions and run their timers until
    ``until`` (virtual seconds); the events each one emitted."""
    got: dict[int, list[object]] = {s.rank: [] for s in sessions}
    now = 0.0
    while now < until:
        moved = False
        for s in sessions:
            items = s.datagrams_to_send(now=now, max_batches=64)
            moved = moved or bool(items)
            _deliver(sessions, items, now)
        for s in sessions:
            timer = s.get_timer()
            if timer is not None and timer <= now:
                s.handle_timer(now=now)
            while (ev := s.next_event()) is not None:
                got[s.rank].append(ev)
        if not moved:
            now += 0.001
    return got


def test_an_abort_ends_the_message_of_its_direction_only() -> None:
    cfg = ProtocolConfig(pacer="unpaced")
    a, b = (Session(rank=r, job=JOB, config=cfg) for r in range(2))
    x = np.arange(400_000, dtype=np.float32)  # several batches: the first is a part
    out_a, out_b = np.zeros_like(x), np.zeros_like(x)
    a.expect_message(1, step=1, msg=0, out=out_a)
    b.expect_message(0, step=1, msg=0, out=out_b)
    a.send_message(1, x, step=1, msg=0, now=0.0)
    b.send_message(0, x + 1, step=1, msg=0, now=0.0)
    # the first of b's data reaches a: a's copy of (b, 1, 0) is under way ...
    _deliver([a, b], b.datagrams_to_send(now=0.0, max_batches=1), 0.0)
    # ... when b abandons the message a sends it
    assert b.cancel(0, step=1, msg=0, outgoing=False)
    ev = _pump([a, b], until=0.5)
    # a: its send is what was aborted; what b sends it arrives whole
    failed = [e for e in ev[0] if isinstance(e, MessageFailed)]
    assert len(failed) == 1 and failed[0].outgoing, ev[0]
    assert "receiver aborted" in failed[0].reason
    assert any(isinstance(e, MessageReceived) for e in ev[0]), ev[0]
    assert np.array_equal(out_a, x + 1)
    # b: its own send was delivered, nothing of its failed
    assert any(isinstance(e, MessageDelivered) for e in ev[1]), ev[1]
    assert not any(isinstance(e, MessageFailed) for e in ev[1]), ev[1]


def test_abort_direction_round_trips_and_other_bits_are_refused() -> None:
    for by_receiver in (False, True):
        msg = Abort(3, 4, 5, reason=AbortReason.CANCELLED, by_receiver=by_receiver)
        assert decode_control(encode_control(msg, job=JOB), job=JOB) == msg
    raw = bytearray(encode_control(Abort(3, 4, 5), job=JOB))
    raw[-1] |= 0x02  # a flag bit that means nothing
    with pytest.raises(WireError, match="reserved bits set in ABORT body"):
        decode_control(bytes(raw), job=JOB)


def test_a_stricter_receive_bound_turns_a_waiting_completion_into_a_nack() -> None:
    # (no FINISH tail: with one, the message completes at once, with nothing to wait out)
    cfg = ProtocolConfig(pacer="unpaced", ordered_paths=False)
    a, b = (Session(rank=r, job=JOB, config=cfg) for r in range(2))
    x = np.arange(40_000, dtype=np.float32)
    a.send_message(1, x, step=2, msg=5, now=0.0, p=0.1)
    lost = 0
    items: list[object] = []
    while more := a.datagrams_to_send(now=0.0, max_batches=64):  # the data, then FINISH
        items += more
    for item in items:  # b has posted nothing yet
        assert isinstance(item, DataBatch | ControlDatagram)
        if isinstance(item, DataBatch):  # drop the first drop-eligible datagram or two
            data = bytes(item.data)
            for at in range(0, len(data), item.segment_size):
                dgram = data[at : at + item.segment_size]
                if lost < 2 and dgram[28] & 0x10:  # tclass (byte 28): the drop bit
                    lost += 1
                    continue
                b.receive_batch(np.frombuffer(dgram, np.uint8), len(dgram), now=0.0)
        else:
            b.receive_datagram(item.data, now=0.0)  # FINISH
    assert lost == 2
    # complete by p = 0.1, waiting out the reorder grace; then the application asks
    # for the whole message
    out = np.zeros_like(x)
    b.expect_message(0, step=2, msg=5, out=out, p=0.0)
    b.handle_timer(now=0.01)  # past the grace: a NACK goes out, the timer moves on
    timer = b.get_timer()
    assert timer is not None and timer > 0.01, timer  # not a deadline already past
    ev = _pump([a, b], until=1.0)
    assert any(isinstance(e, MessageReceived) for e in ev[1]), ev[1]
    assert np.array_equal(out, x)  # the NACK brought the dropped chunks back


def test_nack_ranges_cost_memory_in_the_message_not_in_the_ranges() -> None:
    """A NACK of many overlapping ranges, each naming the whole message (a buggy
    or hostile receiver: 64 parts x 170 ranges), used to materialise every range
    (about 8.7 GB for 100,000 chunks); now one mask of the message's chunks."""
    ranges = [(0, 2**32 - 1)] * (64 * 170) + [(5, 3), (99_990, 50)]
    named = chunks_in_ranges(ranges, 100_000)
    assert np.array_equal(named, np.arange(100_000))
    assert np.array_equal(chunks_in_ranges([(7, 2), (8, 3), (200, 5)], 100), [7, 8, 9, 10])
    assert len(chunks_in_ranges([], 10)) == 0


def test_finishes_for_unknown_messages_are_bounded() -> None:
    """FINISHes of messages whose data never came are kept a while (a FINISH can
    overtake its data); a flood of them keeps at most the newest 1024."""
    b = Session(rank=1, job=JOB, config=ProtocolConfig())
    for step in range(3000):
        finish = Finish(step, 1, 0, round=0, total_chunks=1, protected_chunks=1,
                        class_chunks=(1,) + (0,) * 15)  # fmt: skip
        b.receive_datagram(encode_control(finish, job=JOB), now=0.0)
    assert len(b._inbox._orphan_finish) == 1024
    assert (0, 2999, 1) in b._inbox._orphan_finish  # the newest are kept


def test_a_nack_with_merged_ranges_still_asks_for_enough() -> None:
    """More gaps than one NACK round can name (170 ranges x 64 parts) are merged,
    so the ranges name chunks that arrived too. The sender counts the protected
    chunks it resends of them towards ``needed_elems``: with the receiver asking
    for exactly what the bound lacked, a round could resend only chunks that were
    there, and the message gave up after 8 rounds (200,000 chunks, 30 % of the
    first transmissions lost). The receiver now asks for the named chunks that
    arrived on top, and one round completes it."""
    from dlcp.proto.wire import Flags

    cfg = ProtocolConfig(payload_bytes=16, batch_packets=1024, pacer="unpaced")
    a, b = (Session(rank=r, job=JOB, config=cfg) for r in range(2))
    rng = np.random.default_rng(1)
    x = rng.standard_normal(200_000 * 4).astype(np.float32)
    a.send_message(1, x, step=0, msg=0, now=0.0, p=0.1)
    got: list[object] = []
    now = 0.0
    while not got and now < 1.0:
        now += 0.001
        for src, dst in ((a, b), (b, a)):
            for item in src.datagrams_to_send(now=now):
                if isinstance(item, ControlDatagram):
                    dst.receive_datagram(item.data, now=now)
                    continue
                data, size = bytes(item.data), item.segment_size
                for start in range(0, len(data), size):
                    d = data[start : start + size]
                    if d[1] & Flags.RETRANSMIT or rng.random() >= 0.3:
                        dst.receive_datagram(d, now=now)
        for s in (a, b):
            s.handle_timer(now=now)
            while (ev := s.next_event()) is not None:
                got.append(ev)
    # (the sender may learn of it in the same tick: nothing failed)
    received = [e for e in got if isinstance(e, MessageReceived)]
    assert len(received) == 1 and all(type(e) in (MessageReceived, MessageDelivered)
                                      for e in got), got  # fmt: skip
    report = received[0].report
    assert report.lost_elems <= 0.1 * len(x)
    assert report.nack_rounds == 1


def test_previous_fill_without_a_buffer_of_the_callers_fills_zeros_and_says_so() -> None:
    """default_fill=PREVIOUS for a message that arrived before any receive named
    its buffer: the session's own buffer holds no previous values, and its lost
    elements used to come out as whatever the allocator left there."""
    from dlcp.proto.config import FillPolicy

    cfg = ProtocolConfig(
        pacer="unpaced",
        default_fill=FillPolicy.PREVIOUS,
        payload_bytes=256,
        classifier="magnitude",
        classifier_options={"drop_fraction": 0.5},
    )
    a, b = (Session(rank=r, job=JOB, config=cfg) for r in range(2))
    junk = [np.full(4096, 7.0, np.float32) for _ in range(50)]  # memory np.empty may reuse
    del junk
    x = np.ones(4096, np.float32)
    a.send_message(1, x, step=0, msg=0, now=0.0, p=0.2)
    got = _losing_chunk_3(a, b)
    assert got.report.lost_ranges == ((192, 64),)
    assert got.report.fill is FillPolicy.ZERO
    assert not got.data[192:256].any()


def _losing_chunk_3(
    a: Session, b: Session, *, after_first: Callable[[], None] | None = None
) -> MessageReceived:
    """``a``'s first round to ``b`` but chunk 3 (``after_first`` runs once ``b``
    has its first datagram), then both until ``b`` has the message."""
    for item in a.datagrams_to_send(now=0.0):
        if isinstance(item, DataBatch):
            data = bytes(item.data)
            for at in range(0, len(data), item.segment_size):
                dgram = data[at : at + item.segment_size]
                if int.from_bytes(dgram[12:16], "big") != 3:  # chunk 3 is lost
                    b.receive_datagram(dgram, now=0.0)
                if at == 0 and after_first is not None:
                    after_first()
        else:
            b.receive_datagram(item.data, now=0.0)
    ev = _pump([a, b], until=0.5)
    (got,) = [e for e in ev[1] if isinstance(e, MessageReceived)]
    return got


@pytest.mark.parametrize("refused", [False, True])
def test_a_refused_receive_leaves_the_message_as_it_was(refused: bool) -> None:
    """A receive posted, with fill='previous' and a tighter bound, for a message
    already arriving, and refused (its out= is the wrong size): the message keeps
    its fill, bound and charge as if it had never been posted. (It took the fill
    before the size check, and its lost elements came out as whatever its own
    buffer held, a spare with another message's values, reported as 'previous'.)"""
    from dlcp.proto.config import FillPolicy
    from dlcp.proto.reassembler import GeometryError

    cfg = ProtocolConfig(pacer="unpaced", payload_bytes=256, classifier="magnitude",
                         classifier_options={"drop_fraction": 0.5})  # fmt: skip
    a, b = (Session(rank=r, job=JOB, config=cfg) for r in range(2))
    b.keep_spare(np.full(4096, 7.0, np.float32))  # (another message's values)
    a.send_message(1, np.ones(4096, np.float32), step=0, msg=0, now=0.0, p=0.2)

    def refuse() -> None:  # (the message is under way: a receive refused)
        with pytest.raises(GeometryError, match=r"output buffer is float32\[10\]"):
            b.expect_message(0, step=0, msg=0, out=np.zeros(10, np.float32), p=0.0,
                             fill=FillPolicy.PREVIOUS)  # fmt: skip

    got = _losing_chunk_3(a, b, after_first=refuse if refused else None)
    assert got.report.lost_ranges == ((192, 64),)  # (the bound of 0.2 held: not resent)
    assert got.report.fill is FillPolicy.ZERO
    assert not got.data[192:256].any()
    assert b._inbox._unexpected_bytes > 0  # (still charged: nobody claimed it)


def test_a_message_key_is_not_reused_while_its_receiver_remembers_it() -> None:
    """A second message under a key that completed a moment ago was taken by the
    receiver for a late copy of the first: its data dropped as late, its FINISH
    answered with the first one's STOP, and the sender told it was delivered."""
    cfg = ProtocolConfig(pacer="unpaced", completed_memory=4)
    a, b = (Session(rank=r, job=JOB, config=cfg) for r in range(2))
    a.send_message(1, np.ones(1000, np.float32), step=5, msg=1, now=0.0)
    ev = _pump([a, b], until=0.1)
    assert any(isinstance(e, MessageDelivered) for e in ev[0])
    with pytest.raises(ValueError, match=r"\(step 5, msg 1\) to rank 1 was sent already"):
        a.send_message(1, np.full(1000, 2.0, np.float32), step=5, msg=1, now=0.1)
    for m in range(2, 6):  # four later messages: the receiver forgot (5, 1) by now
        a.send_message(1, np.ones(10, np.float32), step=5, msg=m, now=0.1)
    _pump([a, b], until=0.2)
    a.send_message(1, np.full(1000, 2.0, np.float32), step=5, msg=1, now=0.2)
    ev = _pump([a, b], until=0.3)
    (got,) = [e for e in ev[1] if isinstance(e, MessageReceived)]
    assert np.all(got.data == 2.0)


def _expected_after_a_stray() -> tuple[Session, Session, np.ndarray]:
    """Rank 1 expects float32[1000] (step 3, msg 1) from rank 0 into ``out``, and
    a stray datagram for that key (of a float32[64] message) has come first."""
    from dlcp.proto.wire import DataHeader, encode_data

    cfg = ProtocolConfig(pacer="unpaced")
    a, b = (Session(rank=r, job=JOB, config=cfg) for r in range(2))
    out = np.zeros(1000, np.float32)
    b.expect_message(0, step=3, msg=1, out=out)
    stray = DataHeader(job=JOB, step=3, msg=1, seq=0, offset=0, msg_elems=64, payload_len=256,
                       src=0)  # fmt: skip
    b.receive_datagram(encode_data(stray, bytes(256)), now=0.0)
    return a, b, out


def test_one_stray_datagram_does_not_decide_an_expected_message() -> None:
    """A datagram that passes the wire checks but disagrees with the expected
    buffer (a stray, or forged without authentication) failed the message at once,
    and the sender's real packets were refused after it."""
    a, b, out = _expected_after_a_stray()
    assert b.stats.rejected == {"geometry": 1}
    x = np.arange(1000, dtype=np.float32)
    a.send_message(1, x, step=3, msg=1, now=0.0)
    ev = _pump([a, b], until=0.3)
    assert [type(e) for e in ev[1]] == [MessageReceived], ev[1]
    assert [type(e) for e in ev[0]] == [MessageDelivered], ev[0]
    assert np.array_equal(out, x)


def test_a_sender_whose_message_does_not_fit_the_buffer_fails_at_its_finish() -> None:
    """The two sides disagree (64 elements sent, 1000 expected): no packet fits,
    and the sender's FINISH fails the receive with the geometry, and the send."""
    cfg = ProtocolConfig(pacer="unpaced")
    a, b = (Session(rank=r, job=JOB, config=cfg) for r in range(2))
    b.expect_message(0, step=3, msg=1, out=np.zeros(1000, np.float32))
    a.send_message(1, np.ones(64, np.float32), step=3, msg=1, now=0.0)
    ev = _pump([a, b], until=0.3)
    (failed,) = ev[1]
    assert isinstance(failed, MessageFailed)
    assert "output buffer is float32[1000], message is float32[64]" in failed.reason
    (sent,) = ev[0]
    assert isinstance(sent, MessageFailed) and "receiver aborted" in sent.reason


def test_a_read_only_buffer_is_refused_when_the_receive_is_posted() -> None:
    (b,) = (Session(rank=1, job=JOB, config=ProtocolConfig()),)
    out = np.zeros(10, np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        b.expect_message(0, step=0, msg=0, out=out)


def test_a_finish_that_overtakes_its_data_after_a_stray_datagram_waits_for_it() -> None:
    """FINISH travels over TCP and can arrive before the data: after a stray
    datagram that did not fit out=, a FINISH that fits it must not fail the
    message (only one that disagrees with out= does)."""
    a, b, out = _expected_after_a_stray()
    x = np.arange(1000, dtype=np.float32)
    a.send_message(1, x, step=3, msg=1, now=0.0)
    items: list[object] = []
    while more := a.datagrams_to_send(now=0.0, max_batches=64):
        items += more
    finishes = [i for i in items if isinstance(i, ControlDatagram)]
    assert finishes
    _deliver([a, b], finishes, 0.0)  # the FINISH first ...
    assert b.next_event() is None
    _deliver([a, b], [i for i in items if isinstance(i, DataBatch)], 0.0)  # ... then the data
    ev = _pump([a, b], until=0.3)
    assert [type(e) for e in ev[1]] == [MessageReceived], ev[1]
    assert np.array_equal(out, x)
