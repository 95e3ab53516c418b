"""Lent sends (``borrow=True``) on sessions that hand rounds out whole: the
records are headers only and the driver gathers each datagram's payload from
the sender's own array. Checked against copied rounds byte for byte, and end
to end over the in-memory link (which sends a whole round as an unpaced engine
would) through loss, reordering and duplication, retransmissions included."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.linkemu import LossyLink
from dlcp.proto.session import MessageDelivered, MessageReceived, RoundPost, Session
from dlcp.proto.wire import AUTH_TRAILER_LEN, DATA_HEADER_LEN
from tests.proto.session_helpers import (
    JOB,
    KEY,
    config,
    has_event,
    is_data,
    is_retransmit,
    only_received,
    same_bits,
    seq_of,
)


def _round_of(session: Session, **send: object) -> RoundPost:
    session.send_message(1, now=0.0, **send)  # type: ignore[arg-type]
    posts = [t for t in session.datagrams_to_send(now=0.0) if isinstance(t, RoundPost)]
    assert len(posts) == 1
    return posts[0]


# a short last chunk, none, and headers built across several blocks of the C kernel
@pytest.mark.parametrize("elems", [1000, 1024, 200_003])
def test_a_lent_round_is_the_copied_round_byte_for_byte(elems: int) -> None:
    data = np.random.default_rng(1).standard_normal(elems).astype(np.float32)
    segments = [(0, elems // 3, 0), (elems // 3, elems - elems // 3, 1)]
    copied = _round_of(
        Session(rank=0, job=JOB, config=config(), whole_rounds=True),
        data=data, step=3, msg=1, segments=segments,
    )  # fmt: skip
    lent = _round_of(
        Session(rank=0, job=JOB, config=config(), whole_rounds=True),
        data=data, step=3, msg=1, segments=segments, borrow=True,
    )  # fmt: skip
    assert copied.payload is None and lent.payload is not None
    assert lent.records.shape == (lent.count, DATA_HEADER_LEN)
    assert lent.payload.ctypes.data == data.ctypes.data  # the sender's own memory
    assert (lent.count, lent.stride, lent.short, lent.short_len) == (
        copied.count, copied.stride, copied.short, copied.short_len,
    )  # fmt: skip
    assert [lent.datagram(i) for i in range(lent.count)] == [
        copied.datagram(i) for i in range(copied.count)
    ]


def test_a_session_that_paces_itself_copies_what_it_is_lent() -> None:
    data = np.arange(1000, dtype=np.float32)
    paced = Session(rank=0, job=JOB, config=config())
    paced.send_message(1, data, step=0, msg=0, now=0.0, borrow=True)
    batches = paced.datagrams_to_send(now=0.0)
    assert batches and all(not isinstance(b, RoundPost) for b in batches)


@pytest.mark.parametrize("elems", [1000, 1024])  # a short last chunk, and none
def test_an_authenticated_lent_round_is_the_copied_round_but_for_the_seal(elems: int) -> None:
    # the records hold header and trailer; the driver seals each datagram where
    # its pieces lie (tests/proto/test_gmac.py checks the engine's tags)
    data = np.random.default_rng(3).standard_normal(elems).astype(np.float32)
    cfg = config(authenticate=True)
    copied = _round_of(
        Session(rank=0, job=JOB, config=cfg, key=KEY, whole_rounds=True),
        data=data, step=0, msg=0,
    )  # fmt: skip
    lent = _round_of(
        Session(rank=0, job=JOB, config=cfg, key=KEY, whole_rounds=True),
        data=data, step=0, msg=0, borrow=True,
    )  # fmt: skip
    assert copied.payload is None and lent.payload is not None
    assert lent.payload.ctypes.data == data.ctypes.data
    assert lent.records.shape == (lent.count, DATA_HEADER_LEN + AUTH_TRAILER_LEN)
    assert lent.key == copied.key is not None and lent.nonces is not None
    assert (lent.count, lent.stride, lent.short, lent.short_len) == (
        copied.count, copied.stride, copied.short, copied.short_len,
    )  # fmt: skip
    for i in range(lent.count):
        ours, theirs = lent.datagram(i), copied.datagram(i)
        assert len(ours) == len(theirs)
        assert ours[:-AUTH_TRAILER_LEN] == theirs[:-AUTH_TRAILER_LEN], f"datagram {i}"


@pytest.mark.parametrize("p", [0.0, 0.05])
def test_lent_messages_arrive_through_loss_reordering_and_duplication(p: float) -> None:
    sender = Session(rank=0, job=JOB, config=config(), whole_rounds=True)
    receiver = Session(rank=1, job=JOB, config=config())
    link = LossyLink([sender, receiver], loss=0.15, reorder=True, duplicate=0.05, seed=4)
    data = np.random.default_rng(2).standard_normal(3000).astype(np.float32)
    original = data.copy()
    receiver.expect_message(0, step=5, msg=2, p=p)
    sender.send_message(1, data, step=5, msg=2, now=0.0, p=p, borrow=True)
    link.run(stop_when=has_event(MessageDelivered, 0))
    got = only_received(link)
    assert isinstance(got, MessageReceived)
    assert link.stats.data_dropped > 0
    retransmitted = sum(1 for r, e in link.events if r == 0 and isinstance(e, MessageDelivered)
                        and e.report.retransmitted_packets > 0)  # fmt: skip
    assert retransmitted == 1, "the lost datagrams were sent again, from the lent array"
    if p == 0:
        assert same_bits(got.data, original)
    else:  # what arrived is the sender's; what was lost is within the bound, zeroed
        lost = got.report.lost_elems
        assert lost <= p * len(data)
        kept = got.data != 0
        assert np.array_equal(got.data[kept], original[kept])
        assert len(data) - int(kept.sum()) >= lost
    assert same_bits(data, original)  # the lender's array was only read


def test_a_retransmitted_lent_datagram_is_flagged_and_carries_its_chunk() -> None:
    sender = Session(rank=0, job=JOB, config=config(), whole_rounds=True)
    receiver = Session(rank=1, job=JOB, config=config())
    seen: list[bytes] = []

    def drop_the_first_of_chunk_3(datagram: bytes) -> bool:
        seen.append(datagram)
        return is_data(datagram) and seq_of(datagram) == 3 and not is_retransmit(datagram)

    link = LossyLink([sender, receiver], drop_filter=drop_the_first_of_chunk_3)
    data = np.arange(2000, dtype=np.float32)
    receiver.expect_message(0, step=0, msg=0)
    sender.send_message(1, data, step=0, msg=0, now=0.0, borrow=True)
    link.run(stop_when=has_event(MessageDelivered, 0))
    assert same_bits(only_received(link).data, data)
    resent = [d for d in seen if is_data(d) and is_retransmit(d)]
    assert [seq_of(d) for d in resent] == [3]
    chunk = len(resent[0]) - DATA_HEADER_LEN
    assert resent[0][DATA_HEADER_LEN:] == data.view(np.uint8)[3 * chunk : 4 * chunk].tobytes()
