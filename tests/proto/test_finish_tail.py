"""FINISH's tail (docs/spec.md §5.3, §8): the last chunk of the round on each
path. A receiver on ordered paths that holds every tail chunk has all of the
round's data that was not lost, so it NACKs, or completes by the bound, without
waiting out the reorder grace; with ``ordered_paths`` off, or a tail chunk still
missing, it waits as before."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import dlcp.proto.recovery as recovery
from dlcp.errors import UsageError
from dlcp.proto.control import (
    MAX_FINISH_TAIL,
    Finish,
    Nack,
    decode_control,
    encode_control,
)
from dlcp.proto.events import ControlDatagram, DataBatch
from dlcp.proto.session import RoundPost, Session
from tests.proto.session_helpers import JOB, config, received_events

GRACE = 0.002
CHUNK_ELEMS = 64  # float32 chunks of the helpers' payload
N_CHUNKS = 8


def _seq(d: bytes) -> int:
    return int.from_bytes(d[12:16], "big")


def _round(
    a: Session,
    b: Session,
    *,
    drop: Callable[[bytes], bool],
    hold: Callable[[bytes], bool],
    now: float,
) -> tuple[list[bytes], Finish, bytes]:
    """Everything ``a`` has to send, at ``now``: data datagrams into ``b`` except
    those ``drop`` loses and those ``hold`` keeps back (returned, to deliver
    later); the FINISH is returned undelivered (decoded, and as sent)."""
    held: list[bytes] = []
    finish: Finish | None = None
    raw = b""
    while items := a.datagrams_to_send(now=now, max_batches=64):
        for item in items:
            if isinstance(item, DataBatch):
                data = bytes(item.data)
                for at in range(0, len(data), item.segment_size):
                    d = data[at : at + item.segment_size]
                    if drop(d):
                        continue
                    if hold(d):
                        held.append(d)
                        continue
                    b.receive_batch(np.frombuffer(d, np.uint8), len(d), now=now)
            else:
                assert isinstance(item, ControlDatagram)
                msg = decode_control(item.data, job=JOB)
                assert isinstance(msg, Finish), msg
                finish = msg
                raw = item.data
    assert finish is not None
    return held, finish, raw


def _nacks(s: Session, now: float) -> list[Nack]:
    out = []
    for item in s.datagrams_to_send(now=now, max_batches=64):
        if isinstance(item, ControlDatagram):
            msg = decode_control(item.data, job=JOB)
            if isinstance(msg, Nack):
                out.append(msg)
    return out


def _pair(**cfg: object) -> tuple[Session, Session, np.ndarray]:
    c = config(pacer="unpaced", **cfg)
    a, b = (Session(rank=r, job=JOB, config=c) for r in range(2))
    x = np.arange(N_CHUNKS * CHUNK_ELEMS, dtype=np.float32)
    return a, b, x


def _never(d: bytes) -> bool:
    return False


def _first_copy_of(seq: int) -> Callable[[bytes], bool]:
    return lambda d: _seq(d) == seq and not d[1] & 2


@pytest.mark.parametrize("ordered", [True, False])
def test_a_finish_whose_tail_landed_is_nacked_at_once(ordered: bool) -> None:
    a, b, x = _pair(ordered_paths=ordered)
    a.send_message(1, x, step=1, msg=0, now=0.0, p=0.0)
    b.expect_message(0, step=1, msg=0)
    _, finish, raw = _round(a, b, drop=_first_copy_of(2), hold=_never, now=1.0)
    assert finish.tail == (N_CHUNKS - 1,)  # one path: the round's last chunk
    b.receive_datagram(raw, now=1.0)
    due = b.get_timer()
    assert due == (1.0 if ordered else pytest.approx(1.0 + GRACE)), due
    b.handle_timer(now=1.0)
    nacks = _nacks(b, 1.0)
    if ordered:  # every datagram of the round is in or lost: chunk 2 is missing
        assert [r for n in nacks for r in n.ranges] == [(2, 1)], nacks
    else:  # the grace first, for datagrams that could still be on their way
        assert nacks == []
        b.handle_timer(now=1.0 + GRACE)
        assert [r for n in _nacks(b, 1.0 + GRACE) for r in n.ranges] == [(2, 1)]


def test_the_tail_landing_after_the_finish_brings_the_nack_forward() -> None:
    """FINISH overtook the round's last datagram: the NACK waits for it (or for
    the grace), and goes as soon as it lands."""
    a, b, x = _pair()
    a.send_message(1, x, step=1, msg=0, now=0.0, p=0.0)
    b.expect_message(0, step=1, msg=0)
    held, _, raw = _round(
        a, b, drop=_first_copy_of(2), hold=lambda d: _seq(d) == N_CHUNKS - 1, now=1.0
    )
    b.receive_datagram(raw, now=1.0)
    assert b.get_timer() == pytest.approx(1.0 + GRACE)  # the tail is not in yet
    b.handle_timer(now=1.0)
    assert _nacks(b, 1.0) == []
    (last,) = held
    b.receive_batch(np.frombuffer(last, np.uint8), len(last), now=1.0005)
    assert b.get_timer() == 1.0005
    b.handle_timer(now=1.0005)
    assert [r for n in _nacks(b, 1.0005) for r in n.ranges] == [(2, 1)]


@pytest.mark.parametrize("ordered", [True, False])
def test_completion_by_the_bound_waits_no_grace_once_the_tail_landed(ordered: bool) -> None:
    a, b, x = _pair(ordered_paths=ordered)
    a.send_message(1, x, step=1, msg=0, now=0.0, p=0.2)  # one chunk of 8 may go
    b.expect_message(0, step=1, msg=0)
    eligible = [False]

    def first_eligible(d: bytes) -> bool:  # the drop bit of the tclass byte
        if not eligible[0] and d[28] & 0x10:
            eligible[0] = True
            return True
        return False

    _, _, raw = _round(a, b, drop=first_eligible, hold=_never, now=1.0)
    assert eligible[0]
    b.receive_datagram(raw, now=1.0)
    got = received_events(b)
    if ordered:
        assert len(got) == 1 and got[0].report.lost_elems == CHUNK_ELEMS
    else:
        assert got == []  # SETTLING: the grace first
        b.handle_timer(now=1.0 + GRACE)
        assert len(received_events(b)) == 1


def test_a_merged_nack_leaves_the_next_rounds_tail_untrusted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A NACK whose ranges were merged names chunks the receiver holds; the next
    round may resend one of them last, so holding it says nothing of the round:
    the grace is waited again."""
    monkeypatch.setattr(recovery, "MAX_NACK_RANGES", 1)
    monkeypatch.setattr(recovery, "MAX_NACK_PARTS", 1)
    a, b, x = _pair()
    a.send_message(1, x, step=1, msg=0, now=0.0, p=0.0)
    b.expect_message(0, step=1, msg=0)
    # chunks 1 and 5 lost: one range allowed, so the NACK names 1..5 (merged)
    _, _, raw = _round(
        a, b, drop=lambda d: _seq(d) in (1, 5) and not d[1] & 2, hold=_never, now=1.0
    )
    b.receive_datagram(raw, now=1.0)
    b.handle_timer(now=1.0)
    (nack,) = _nacks(b, 1.0)
    assert nack.ranges == ((1, 5),)
    a.receive_datagram(encode_control(nack, job=JOB), now=1.001)
    # round 1 resends 1..5, of which 2, 3, 4 are here already; 1 is lost again
    _, finish1, raw1 = _round(a, b, drop=lambda d: _seq(d) == 1, hold=_never, now=1.002)
    assert finish1.round == 1 and finish1.tail == (5,)
    b.receive_datagram(raw1, now=1.002)
    assert b.get_timer() == pytest.approx(1.002 + GRACE)


def test_the_tail_names_the_last_chunk_of_each_path() -> None:
    a, _, x = _pair(n_paths=3, spray_packets=1)
    a.send_message(1, x, step=1, msg=0, now=0.0, p=0.0)
    last: dict[int, int] = {}
    finish = None
    while items := a.datagrams_to_send(now=0.0, max_batches=64):
        for item in items:
            if isinstance(item, DataBatch):
                data = bytes(item.data)
                for at in range(0, len(data), item.segment_size):
                    last[item.path] = _seq(data[at : at + item.segment_size])
            else:
                finish = decode_control(item.data, job=JOB)
    assert isinstance(finish, Finish)
    assert len(last) == 3
    assert sorted(finish.tail) == sorted(last.values())


def test_no_tail_when_the_driver_may_send_a_round_out_of_order() -> None:
    c = config(pacer="unpaced")
    a = Session(rank=0, job=JOB, config=c, whole_rounds=True, ordered_rounds=False)
    x = np.arange(N_CHUNKS * CHUNK_ELEMS, dtype=np.float32)
    a.send_message(1, x, step=1, msg=0, now=0.0, p=0.0)
    (post,) = a.datagrams_to_send(now=0.0, max_batches=64)
    assert isinstance(post, RoundPost)
    a.round_sent(1, step=1, msg=0, began=(0.0, 0), last=(0.0, 0), now=0.0)
    (item,) = a.datagrams_to_send(now=0.0, max_batches=64)
    assert isinstance(item, ControlDatagram)
    finish = decode_control(item.data, job=JOB)
    assert isinstance(finish, Finish) and finish.tail == ()


def test_the_codec_carries_the_tail_and_refuses_a_bad_one() -> None:
    classes = (0, 8) + (0,) * 14
    f = Finish(1, 2, 3, round=1, total_chunks=8, protected_chunks=0, class_chunks=classes,
               tail=(5, 7))  # fmt: skip
    raw = encode_control(f, job=JOB)
    assert len(raw) == 16 + 76 + 8
    assert decode_control(raw, job=JOB) == f
    with pytest.raises(UsageError, match="tail"):
        encode_control(Finish(1, 2, 3, total_chunks=8, class_chunks=classes, tail=(8,)), job=JOB)
    with pytest.raises(UsageError, match="tail"):
        encode_control(
            Finish(1, 2, 3, total_chunks=8, class_chunks=classes,
                   tail=tuple(range(8)) * 33),
            job=JOB,
        )  # fmt: skip
    assert MAX_FINISH_TAIL == 256
