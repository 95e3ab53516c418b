"""Recovery timing between two sessions over the in-memory link: a NACK that
other traffic of the same sender must not starve, a sender that gives up and
says so, and a send timer that names the batch that goes next."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dlcp.linkemu import LossyLink
from dlcp.proto.control import Abort, AbortReason, Nack, decode_control
from dlcp.proto.events import ControlDatagram, DataBatch
from dlcp.proto.recovery import PENDING_NACK_TIMEOUTS
from dlcp.proto.session import MessageFailed, MessageReceived, Session
from tests.proto.session_helpers import JOB, config, events, sessions


def _drop_first_copy(msg: int, seq: int) -> Callable[[bytes], bool]:
    """Drop the first transmission of chunk ``seq`` of message ``msg`` (not its
    retransmission: the RETRANSMIT flag is bit 1 of the flags byte)."""

    def drop(d: bytes) -> bool:
        return (
            d[0] == 0x11
            and int.from_bytes(d[8:10], "big") == msg
            and int.from_bytes(d[12:16], "big") == seq
            and not d[1] & 2
        )

    return drop


def _small_behind_a_stream(
    drop: Callable[[bytes], bool], *, big: int = 3_000_000, **protocol: object
) -> tuple[np.ndarray, LossyLink]:
    """Rank 0 sends a small message (msg 0, 4 chunks, p = 0) and then ``big``
    float32 (msg 1; 12 MB) to rank 1 at 4 MB/s, over a link that drops what
    ``drop`` says; ``protocol``: more settings."""
    cfg = config(
        payload_bytes=1024,
        batch_packets=4,
        pacer_options={"initial_rate": 4e6, "min_rate": 4e6, "max_rate": 4e6,
                       "burst_bytes": 4096},
        **protocol,
    )  # fmt: skip
    a, b = sessions(2, cfg)
    small = np.arange(1024, dtype=np.float32)
    a.send_message(1, small, step=1, msg=0, now=0.0)
    a.send_message(1, np.ones(big, dtype=np.float32), step=1, msg=1, now=0.0)
    b.expect_message(0, step=1, msg=0)
    b.expect_message(0, step=1, msg=1)
    return small, LossyLink([a, b], drop_filter=drop)


def test_a_stream_of_other_messages_does_not_starve_a_nack() -> None:
    """A NACK waits for the sender's data to pause (it may be a backlog), but a
    sender that keeps streaming another message must not hold it back for more
    than nack_timeout after the FINISH: before, message A waited for the whole
    12 MB of B at 4 MB/s, its sender gave up after 2 s and told nobody."""
    # 4 chunks, p = 0: chunk 1 must come again
    small, link = _small_behind_a_stream(_drop_first_copy(0, 1))
    link.run(until=40.0)
    got = {e.msg: e for e in events(link, MessageReceived, rank=1)}
    assert set(got) == {0, 1}, link.events
    assert not events(link, MessageFailed)
    assert got[0].report.nack_rounds == 1  # (repeats of one round are not rounds)
    assert got[0].report.duration < 0.5, got[0].report.duration  # not after B's 3 s
    assert np.array_equal(got[0].data, small)


def test_a_stream_of_other_messages_does_not_starve_the_nack_of_an_orphan_finish() -> None:
    """The same for a message none of whose data arrived (its FINISH is an
    orphan): NACKed within nack_timeout, not after the other stream."""

    def first_copies_of_small(d: bytes) -> bool:
        return d[0] == 0x11 and int.from_bytes(d[8:10], "big") == 0 and not d[1] & 2

    small, link = _small_behind_a_stream(first_copies_of_small)
    link.run(until=40.0)
    got = {e.msg: e for e in events(link, MessageReceived, rank=1)}
    assert set(got) == {0, 1}, link.events
    assert not events(link, MessageFailed)
    assert np.array_equal(got[0].data, small)


def test_a_sender_that_gives_up_tells_the_receiver() -> None:
    """A receiver that never answers FINISH: the sender fails the message after
    its FINISH retries and sends ABORT(PEER_TIMEOUT) (spec §8), so the receiver
    does not NACK a sender that has given up until its own idle timeout."""
    a, _ = sessions(2)
    a.send_message(1, np.ones(100, np.float32), step=0, msg=5, now=0.0)
    now, sent = 0.0, []
    while now < 10.0:
        sent += a.datagrams_to_send(now=now, max_batches=64)
        timer = a.get_timer()
        if timer is None:
            break
        now = max(now, timer)
        a.handle_timer(now=now)
    assert [e for e in iter(a.next_event, None) if isinstance(e, MessageFailed)]
    aborts = [decode_control(d.data, job=JOB) for d in sent if not hasattr(d, "segment_size")]
    aborts = [c for c in aborts if isinstance(c, Abort)]
    assert [(c.msg, c.reason, c.by_receiver) for c in aborts] == [
        (5, AbortReason.PEER_TIMEOUT, False)
    ], aborts


def test_the_send_timer_is_the_batch_that_goes_next() -> None:
    """The pacer is asked about the batch the outbox would send (the highest
    class), not the first pending message's: a small low-class batch that fits
    the tokens made the timer say "now" while the big high-class one could not
    go, and the driver spun."""
    cfg = config(pacer_options={"initial_rate": 1e7, "min_rate": 1e6, "burst_bytes": 200_000})
    a, _ = sessions(2, cfg)
    # one chunk of the last layer (class 0), first in the table; then a class-7 message
    a.send_message(1, np.ones(64, np.float32), step=1, msg=0, now=0.0, segments=[(0, 64, 7)])
    a.send_message(1, np.ones(128_000, np.float32), step=1, msg=1, now=0.0)
    now, spins = 0.0, 0
    for _ in range(100):
        sent = a.datagrams_to_send(now=now)
        timer = a.get_timer()
        if timer is None:
            break
        if not sent and timer <= now:
            spins += 1  # nothing could go, yet the timer says now
        now = max(now, timer)
        a.handle_timer(now=now)
    assert spins == 0, f"{spins} turns of the driver found nothing to send at the timer's time"


def _orphan_then_retransmitted(lose_one_retransmission: bool) -> float:
    """Every first copy of a message (p = 0.05) is lost: its FINISH is an orphan,
    NACKed whole; the retransmissions come, one drop-eligible one lost too if
    asked. Returns when the receiver had the message (virtual seconds)."""
    a, b = sessions(2, config(payload_bytes=1024))
    a.send_message(1, np.random.default_rng(0).standard_normal(64 * 256).astype(np.float32),
                   step=1, msg=0, now=0.0, p=0.05)  # fmt: skip
    lost_again: list[int] = []

    def drop(d: bytes) -> bool:
        if d[0] != 0x11:
            return False
        if not d[1] & 2:  # (RETRANSMIT flag) every first copy
            return True
        if lose_one_retransmission and not lost_again and d[28] & 0x10:  # drop-eligible
            lost_again.append(int.from_bytes(d[12:16], "big"))
            return True
        return False

    link = LossyLink([a, b], drop_filter=drop)
    at = link.run(until=10.0, stop_when=lambda lk: bool(events(lk, MessageReceived, rank=1)))
    assert events(link, MessageReceived, rank=1)
    assert bool(lost_again) == lose_one_retransmission
    return at


def test_a_message_nacked_as_an_orphan_completes_by_the_bound_without_a_second_grace() -> None:
    """Its whole-message NACK came after the reorder grace; the retransmission
    round's one missing drop-eligible chunk is not worth a second wait (it
    completed a grace after the last retransmission instead of with it)."""
    lossless_retransmission = _orphan_then_retransmitted(False)
    one_lost = _orphan_then_retransmitted(True)
    assert one_lost <= lossless_retransmission + config().reorder_grace / 4


def _is_data(d: bytes) -> bool:
    return d[0] == 0x11


def test_a_silent_data_path_fails_both_sides_naming_it() -> None:
    """Every data datagram is dropped while control messages pass (UDP blocked,
    the control channel working): once the silent-path timeout has run from the
    first FINISH, the receiver fails the message naming the data path and sends
    ABORT(DATA_SILENT), which fails it at the sender with the same diagnosis
    (spec §8, receiver rule 6). Before, both resent and NACKed until a timeout
    that said nothing of the data path."""
    a, b = sessions(2, config(silent_path_timeout=1.0))
    a.send_message(1, np.ones(20_000, np.float32), step=3, msg=4, now=0.0, p=0.05)
    b.expect_message(0, step=3, msg=4)
    link = LossyLink([a, b], drop_filter=_is_data)
    end = link.run(until=60.0, stop_when=lambda ln: len(events(ln, MessageFailed)) == 2)
    assert 1.0 <= end < 1.5, end  # the verdict, not a later timeout
    failed = {r: e for r, e in link.events if isinstance(e, MessageFailed)}
    assert set(failed) == {0, 1}, link.events
    assert "UDP data path" in failed[1].reason and "1 s" in failed[1].reason, failed[1].reason
    assert "data path to it drops everything" in failed[0].reason, failed[0].reason
    assert (failed[0].msg, failed[1].msg) == (4, 4)


def test_a_message_whose_data_is_lost_while_other_data_comes_is_not_silent() -> None:
    """A message none of whose first copies arrived, while the same sender's
    other message streams in: the path works, so however short the silent-path
    timeout, the message is NACKed and completes (rule 6 leaves it alone)."""

    def first_copies_of_small(d: bytes) -> bool:
        return d[0] == 0x11 and int.from_bytes(d[8:10], "big") == 0 and not d[1] & 2

    small, link = _small_behind_a_stream(
        first_copies_of_small, big=300_000, silent_path_timeout=0.001
    )
    link.run(until=40.0)
    assert not events(link, MessageFailed), link.events
    got = {e.msg: e for e in events(link, MessageReceived, rank=1)}
    assert set(got) == {0, 1} and np.array_equal(got[0].data, small)


def test_a_small_message_on_a_silent_data_path_ends_by_the_senders_rounds_naming_it() -> None:
    """A message of a few chunks whose data is all dropped: its sender's rounds
    run out (max_rounds) before the receiver's silent-path verdict. Both errors
    still say that none of its data arrived and ask about the UDP path."""
    a, b = sessions(2, config(max_rounds=4))
    a.send_message(1, np.ones(1000, np.float32), step=3, msg=4, now=0.0, p=0.05)
    b.expect_message(0, step=3, msg=4)
    link = LossyLink([a, b], drop_filter=_is_data)
    end = link.run(until=60.0, stop_when=lambda ln: len(events(ln, MessageFailed)) == 2)
    assert end < b.config.silent_path_timeout, end  # (the rounds, not the verdict)
    failed = {r: e for r, e in link.events if isinstance(e, MessageFailed)}
    assert set(failed) == {0, 1}, link.events
    assert "none of its data arrived" in failed[0].reason, failed[0].reason
    assert "UDP data path" in failed[0].reason, failed[0].reason
    assert "gave_up" in failed[1].reason and "UDP data path blocked" in failed[1].reason, (
        failed[1].reason
    )


def _finish_ahead_of_its_data(one_arrived: bool) -> tuple[Session, list[bytes], float]:
    """Rank 0's whole message (1,024 float32, p = 0) is out; rank 1 has its FINISH and
    none of its data (or only its first datagram: ``one_arrived``), the rest
    waiting unread in rank 1's socket (returned, with the time the FINISH came)."""
    a, b = sessions(2)
    b.expect_message(0, step=1, msg=0)
    a.send_message(1, np.arange(1024, dtype=np.float32), step=1, msg=0, now=0.0)
    data: list[bytes] = []
    now = 0.0
    while True:  # until the FINISH goes (the round sent)
        out = a.datagrams_to_send(now=now)
        for t in out:
            if isinstance(t, DataBatch):
                raw = bytes(t.data)
                data += [raw[i : i + t.segment_size] for i in range(0, len(raw), t.segment_size)]
        finish = [t for t in out if isinstance(t, ControlDatagram)]
        if finish:
            break
        timer = a.get_timer()
        assert timer is not None
        now = max(now, timer)
        a.handle_timer(now=now)
    assert len(data) > 1
    if one_arrived:
        b.receive_datagram(data.pop(0), now=now)
    for t in finish:
        b.receive_datagram(t.data, now=now)
    return b, data, now


def _nacks(s: Session, now: float) -> list[Nack]:
    sent = [decode_control(t.data, job=JOB) for t in s.datagrams_to_send(now=now)
            if isinstance(t, ControlDatagram)]  # fmt: skip
    return [c for c in sent if isinstance(c, Nack)]


@pytest.mark.parametrize("one_arrived", [False, True], ids=["orphan-finish", "under-way"])
def test_a_nack_waits_while_data_waits_unread_in_the_receiver_s_socket(one_arrived: bool) -> None:
    """A receiver whose driver runs its timers before it has read a backlog (it
    holds them back 100 ms at most) must not NACK the data in that backlog: it
    did, and a loaded 4-rank DDP job resent whole messages that had arrived."""
    b, data, at = _finish_ahead_of_its_data(one_arrived)
    nack_timeout = b.config.nack_timeout
    # without a backlog: the NACK goes once nack_timeout has passed since the FINISH
    plain = _finish_ahead_of_its_data(one_arrived)[0]
    plain.handle_timer(now=at + 1.5 * nack_timeout)
    assert len(_nacks(plain, at + 1.5 * nack_timeout)) == 1
    # with data waiting unread, it waits (but not for ever: the pending limit)
    for k in (1.5, 5.0, PENDING_NACK_TIMEOUTS - 0.5):
        b.handle_timer(now=at + k * nack_timeout, data_pending=True)
        assert _nacks(b, at + k * nack_timeout) == [], k
    # the backlog read: the message completes, nothing asked for again
    now = at + (PENDING_NACK_TIMEOUTS - 0.4) * nack_timeout
    for d in data:
        b.receive_datagram(d, now=now)
    got = [e for e in iter(b.next_event, None) if isinstance(e, MessageReceived)]
    assert len(got) == 1 and got[0].report.nack_rounds == 0
    # a backlog that never drains still lets the NACK go after the pending limit
    stuck = _finish_ahead_of_its_data(one_arrived)[0]
    late = at + (PENDING_NACK_TIMEOUTS + 0.5) * nack_timeout
    stuck.handle_timer(now=late, data_pending=True)
    assert len(_nacks(stuck, late)) == 1
