"""What a session says it had of a message when its driver gives up on it
(``Session.progress``, ``dlcp.proto.progress``), driven through two real sessions
whose datagrams the test delivers or withholds: each case names what came and
what did not, so that a timeout tells where the message stopped."""

from __future__ import annotations

import re

import numpy as np

from dlcp.proto.config import ProtocolConfig
from dlcp.proto.events import ControlDatagram, DataBatch
from dlcp.proto.session import Session

JOB = 7
CFG = ProtocolConfig(pacer="unpaced", payload_bytes=256, finish_timeout=0.2)
X = np.arange(6400, dtype=np.float32)  # 100 chunks of 64 elements


def _pair(cfg: ProtocolConfig = CFG) -> tuple[Session, Session]:
    a, b = (Session(rank=r, job=JOB, config=cfg) for r in range(2))
    b.expect_message(0, step=1, msg=0, out=np.zeros_like(X))
    a.send_message(1, X, step=1, msg=0, now=0.0)
    return a, b


def _split(items: list[object]) -> tuple[list[DataBatch], list[ControlDatagram]]:
    data = [i for i in items if isinstance(i, DataBatch)]
    control = [i for i in items if isinstance(i, ControlDatagram)]
    assert len(data) + len(control) == len(items), items
    return data, control


def _sent(a: Session) -> tuple[list[DataBatch], list[ControlDatagram]]:
    """What ``a`` sends at time 0: its data batches and its control datagrams."""
    return _split(a.datagrams_to_send(now=0.0, max_batches=64))


def _run_timers(s: Session, now: float, *, until: float) -> float:
    """``s``'s timers as they fall due from ``now`` up to ``until``; the last one's time."""
    while (timer := s.get_timer()) is not None and timer < until:
        now = timer
        s.handle_timer(now=now)
    return now


def _datagrams(batches: list[DataBatch]) -> list[tuple[bytes, int]]:
    out = []
    for b in batches:
        raw = bytes(b.data)
        out += [
            (raw[i : i + b.segment_size], b.segment_size)
            for i in range(0, len(raw), b.segment_size)
        ]
    return out


def _receive(s: Session, grams: list[tuple[bytes, int]], now: float) -> None:
    for raw, seg in grams:
        s.receive_batch(np.frombuffer(raw, dtype=np.uint8), seg, now=now)


def _receive_progress(b: Session, now: float) -> str:
    return b.progress(0, step=1, msg=0, outgoing=False, now=now)


def test_a_receive_of_which_nothing_came_says_so_and_when_its_sender_was_last_heard() -> None:
    _, b = _pair()
    said = _receive_progress(b, 60.0)
    assert said.startswith("nothing of it arrived here, neither data nor its FINISH"), said
    assert "no data from that rank has arrived here" in said, said


def test_a_finish_without_data_points_at_the_data_path() -> None:
    a, b = _pair()
    _, control = _sent(a)
    assert control, "the round's FINISH follows its data"
    for c in control:  # the FINISH arrives, the data does not
        b.receive_datagram(c.data, now=1.0)
    said = _receive_progress(b, 61.0)
    assert said.startswith("its FINISH arrived 60 s ago"), said
    assert "none of its data did: the data path from that rank loses it" in said, said


def test_part_of_the_data_and_no_finish_says_how_much_and_that_the_sender_stopped() -> None:
    a, b = _pair()
    data, _ = _sent(a)
    grams = _datagrams(data)
    assert len(grams) == 100
    _receive(b, grams[:30], now=2.0)  # 30 chunks; the rest and the FINISH do not come
    said = _receive_progress(b, 62.0)
    assert said.startswith(
        "1,920 of its 6,400 elements arrived (30 of 100 chunks), the last 60 s ago"
    ), said
    assert said.endswith("no FINISH came (the sender had not sent all of it)"), said


def test_data_with_a_loss_and_the_finish_says_the_round_and_the_nacks() -> None:
    a, b = _pair()
    data, control = _sent(a)
    grams = _datagrams(data)
    _receive(b, grams[:50] + grams[51:], now=0.5)  # chunk 50 is lost
    for c in control:
        b.receive_datagram(c.data, now=0.5)
    now = _run_timers(b, 0.5, until=1.0)  # its NACK goes out
    nacks = [
        i for i in b.datagrams_to_send(now=now, max_batches=64) if isinstance(i, ControlDatagram)
    ]
    assert nacks, "the lost chunk is NACKed"
    said = _receive_progress(b, 30.5)
    assert said.startswith(
        "6,336 of its 6,400 elements arrived (99 of 100 chunks), the last 30 s ago"
    ), said
    assert said.endswith("its FINISH of round 0 came, after 1 NACK round(s)"), said


def test_a_send_whose_finish_went_unanswered_says_how_often_and_when() -> None:
    a, _ = _pair()
    a.datagrams_to_send(now=0.0, max_batches=64)  # all of round 0, then its FINISH
    now = 0.0
    for _ in range(2):  # two FINISH timeouts: the FINISH goes twice more
        now += CFG.finish_timeout
        a.handle_timer(now=now)
    said = a.progress(1, step=1, msg=0, outgoing=True, now=now + 0.05)
    assert re.fullmatch(
        r"all 100 datagrams of round 0 went out and its FINISH was sent 3 time\(s\), the last "
        r"0\.05 s ago, and neither STOP nor NACK came back",
        said,
    ), said


def test_a_send_that_has_not_gone_out_says_what_holds_it() -> None:
    a, _ = _pair(ProtocolConfig(pacer="unpaced", payload_bytes=256, batch_packets=10))
    said = a.progress(1, step=1, msg=0, outgoing=True, now=5.0)
    assert said.startswith("none of the 100 datagrams of round 0 had gone out"), said
    part = a.datagrams_to_send(now=0.0, max_batches=1)
    assert part and all(isinstance(i, DataBatch) for i in part)
    sent = sum(b.count for b in part if isinstance(b, DataBatch))
    assert 0 < sent < 100
    said = a.progress(1, step=1, msg=0, outgoing=True, now=5.0)
    assert said == f"{sent} of the 100 datagrams of round 0 had gone out", said


def test_a_message_the_session_does_not_know_says_nothing() -> None:
    a, _ = _pair()
    assert a.progress(1, step=9, msg=9, outgoing=True, now=1.0) == ""


def test_a_finish_nacked_whole_while_other_data_of_its_sender_came_still_says_so() -> None:
    """The orphan FINISH's entry and its silent-path clock are cleared by its NACK and
    by the sender's other data; what a timeout reports is kept until its own data
    comes (before, it read "nothing of it arrived" then)."""
    a, b = _pair()
    b.expect_message(0, step=2, msg=0, out=np.zeros_like(X))
    a.send_message(1, X, step=2, msg=0, now=0.0)
    data, control = _sent(a)
    step_of = [int.from_bytes(bytes(d.data[4:8]), "big") for d in data]
    for d, step in zip(data, step_of, strict=True):  # step 1's data is lost, step 2's comes
        if step == 2:
            b.receive_batch(np.frombuffer(bytes(d.data), np.uint8), d.segment_size, now=0.5)
    for c in control:  # both FINISHes come
        b.receive_datagram(c.data, now=0.5)
    _run_timers(b, 0.5, until=2.0)  # step 1's FINISH NACKed whole
    said = _receive_progress(b, 10.5)
    assert said.startswith("its FINISH arrived 10 s ago (all of round 0 was NACKed)"), said


def test_data_refused_by_the_receive_posted_for_it_says_why() -> None:
    a, b = (Session(rank=r, job=JOB, config=CFG) for r in range(2))
    b.expect_message(0, step=1, msg=0, out=np.zeros(100, np.float32))  # not the message's size
    a.send_message(1, X, step=1, msg=0, now=0.0)
    data, _ = _sent(a)
    _receive(b, _datagrams(data), now=1.0)
    said = _receive_progress(b, 2.0)
    assert re.match(r"100 of its datagrams arrived and were refused: packet does not fit", said), (
        said
    )
    assert said.endswith("no FINISH came; data from that rank last arrived 1 s ago"), said
