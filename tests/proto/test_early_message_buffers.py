"""Messages whose first datagrams arrive before their receive is posted start in
a buffer of their own. Once the receive gives its buffer, the inbox keeps that
buffer for the next early message of the same size, so a training loop does not
fault in a bucket-sized buffer every few calls. Nothing of an earlier message may
show through in a later one."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.proto.config import FillPolicy
from dlcp.proto.events import ControlDatagram, DataBatch, MessageReceived
from dlcp.proto.session import Session
from tests.proto.session_helpers import JOB, config
from tests.proto.test_receive_run import STEP, message_datagrams

N = 20_000


def _feed(s: Session, grams: list[bytes]) -> None:
    s.receive_batch(np.frombuffer(b"".join(grams), np.uint8).copy(), len(grams[0]), now=1.0)


def _early_then_expected(s: Session, msg: int, seed: int, *, head: int) -> np.ndarray:
    """Message ``msg`` (data from ``seed``): ``head`` datagrams, then its receive
    with a buffer of the caller's, then the rest; returns that buffer."""
    grams = message_datagrams(N, seed=seed, msg=msg)
    _feed(s, grams[:head])
    out = np.full(N, np.nan, np.float32)
    s.expect_message(0, step=STEP, msg=msg, out=out)
    _feed(s, grams[head:])
    return out


def _received(s: Session) -> list[MessageReceived]:
    got = []
    while (event := s.next_event()) is not None:
        if isinstance(event, MessageReceived):
            got.append(event)
    return got


def test_an_early_message_reuses_the_buffer_the_last_one_gave_back() -> None:
    s = Session(rank=1, job=JOB, config=config())
    inbox = s._inbox
    grams = message_datagrams(N, seed=1, msg=1)
    _feed(s, grams[:40])
    own = inbox._incoming[(0, STEP, 1)].reassembler.out
    assert inbox._incoming[(0, STEP, 1)].reassembler.owns_buffer
    out = np.full(N, np.nan, np.float32)
    s.expect_message(0, step=STEP, msg=1, out=out)
    assert not inbox._incoming[(0, STEP, 1)].reassembler.owns_buffer
    _feed(s, grams[40:])
    (done,) = _received(s)
    assert done.data is out
    want = np.random.default_rng(1).standard_normal(N).astype(np.float32)
    assert out.tobytes() == want.tobytes()
    # the next early message of that size starts in the same memory
    grams = message_datagrams(N, seed=2, msg=2)
    _feed(s, grams[:40])
    r = inbox._incoming[(0, STEP, 2)].reassembler
    assert r.owns_buffer and np.shares_memory(r.out, own)
    # one of another size gets a new one
    _feed(s, message_datagrams(N // 2, seed=3, msg=3)[:5])
    assert not np.shares_memory(inbox._incoming[(0, STEP, 3)].reassembler.out, own)


def _sent(seed: int, msg: int, p: float) -> tuple[list[bytes], list[bytes]]:
    """One message's data datagrams and control messages (its FINISH), as a sender
    with bound ``p`` sends them."""
    tx = Session(rank=0, job=JOB, config=config(classifier="combined"))
    data = np.random.default_rng(seed).standard_normal(N).astype(np.float32)
    tx.send_message(1, data, step=STEP, msg=msg, now=0.0, p=p)
    grams: list[bytes] = []
    control: list[bytes] = []
    for item in tx.datagrams_to_send(now=0.0, max_batches=1 << 20):
        if isinstance(item, DataBatch):
            raw = bytes(item.data)
            grams += [raw[i : i + item.segment_size] for i in range(0, len(raw), item.segment_size)]
        elif isinstance(item, ControlDatagram):
            control.append(bytes(item.data))
    return grams, control


@pytest.mark.parametrize("fill", [FillPolicy.ZERO, FillPolicy.PREVIOUS])
def test_what_a_later_message_lost_is_filled_not_left_from_the_earlier(
    fill: FillPolicy,
) -> None:
    s = Session(rank=1, job=JOB, config=config())
    first = _early_then_expected(s, 1, seed=1, head=40)
    _received(s)
    own = s._inbox._spares.take((N, 4))
    assert own is not None  # (the first message's own buffer, with its values in it)
    first_values = first.copy()
    own.reshape(-1).view(np.float32)[...] = first_values
    s._inbox._spares.give(own)
    # the second message starts early in that buffer and loses three of its
    # drop-eligible chunks, which its bound absorbs
    grams, control = _sent(2, 2, p=0.05)
    eligible = [i for i, g in enumerate(grams) if g[28] & 0x10]
    lost = set(eligible[:3])
    assert len(lost) == 3
    kept = [g for i, g in enumerate(grams) if i not in lost]
    _feed(s, kept[:40])
    r = s._inbox._incoming[(0, STEP, 2)].reassembler
    assert np.shares_memory(r.out, own)
    out = np.full(N, -1.0, np.float32)
    s.expect_message(0, step=STEP, msg=2, out=out, p=0.05, fill=fill)
    _feed(s, kept[40:])
    for c in control:
        s.receive_datagram(c, now=2.0)
    s.handle_timer(now=3.0)
    (done,) = _received(s)
    assert done.data is out and done.report.lost_elems > 0
    want = np.random.default_rng(2).standard_normal(N).astype(np.float32)
    lost_mask = np.zeros(N, bool)
    for off, n in done.report.lost_ranges:
        lost_mask[off : off + n] = True
    assert (out[~lost_mask] == want[~lost_mask]).all()
    # a lost element is the fill's: zero, or the caller's previous value (-1);
    # never the earlier message's
    assert (out[lost_mask] == (0.0 if fill is FillPolicy.ZERO else -1.0)).all()
