"""Receives posted with their buffer before any of their data: the inbox registers
the message with the native receive loop then (``Inbox.expect``), in the
geometry the sender most likely gives it, so that the loop takes even its first
datagrams; and a receive posted after its message began, which moves it to the
buffer it names. Each case ends as the Python receive path ends it (``Pair``
compares the two sessions after every step)."""

from __future__ import annotations

import numpy as np
import pytest

from dlcp.errors import UsageError
from dlcp.io.native_receive import MessageRuns
from dlcp.proto.events import ControlDatagram, DataBatch
from dlcp.proto.session import Session
from dlcp.proto.wire import bound_from_wire, bound_to_wire
from tests.io.test_native_receive import MSG, STEP, Pair, message
from tests.io.test_native_receive import pytestmark as needs_native
from tests.proto.session_helpers import JOB, config, received_events

pytestmark = needs_native

N = 20_000


def _want(seed: int, n: int = N) -> bytes:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32).tobytes()


@pytest.mark.parametrize("receive_p", [None, 0.01, 0.2])
def test_the_first_datagrams_open_it_with_the_senders_bound(receive_p: float | None) -> None:
    """The table takes the first run; the message then opens with the bound its
    datagrams carry (the tighter of the sender's and the receive's), as a message
    the first path opens does."""
    grams, _ = message(N, seed=21, p=0.05)
    seg = len(grams[0])
    pair = Pair(N, expect=False)
    pair.outs = [np.full(N, np.nan, np.float32) for _ in range(2)]
    for s, out in zip(pair.sessions, pair.outs, strict=True):
        s.expect_message(0, step=STEP, msg=MSG, out=out, p=receive_p)
    assert len(pair.native.runs) == 1  # registered before its data
    pair.feed([(grams[:9], seg)])
    assert pair.native.native == 9  # the first run too
    (state,) = pair.native.session._inbox._incoming.values()
    sender = bound_from_wire(bound_to_wire(0.05))
    assert state.reassembler.bound == (sender if receive_p is None else min(sender, receive_p))
    pair.feed([(grams[9:], seg)])
    assert pair.outs[0] is not None and pair.outs[0].tobytes() == _want(21)
    assert len(pair.native.runs) == 0


def test_a_sender_that_cuts_other_chunks_opens_it_in_python() -> None:
    """Datagrams that do not fit the guess go to the general path, which opens the
    message with their geometry and registers it in place of the guess."""
    tx = Session(rank=0, job=JOB, config=config(pacer="unpaced", payload_bytes=512))
    data = np.random.default_rng(22).standard_normal(N).astype(np.float32)
    tx.send_message(1, data, step=STEP, msg=MSG, now=0.0)
    batches = [b for b in tx.datagrams_to_send(now=0.0, max_batches=1 << 20)
               if isinstance(b, DataBatch)]  # fmt: skip
    grams = [bytes(b.data)[i : i + b.segment_size]
             for b in batches for i in range(0, len(b.data), b.segment_size)]  # fmt: skip
    seg = len(grams[0])
    pair = Pair(N, expect=True)
    posted = pair.native.session._inbox._expected[(0, STEP, MSG)].posted
    assert posted is not None and posted.chunk_elems != 128
    pair.feed([(grams[:7], seg)])
    assert pair.native.native == 0  # the guess did not fit: Python opened it
    (state,) = pair.native.session._inbox._incoming.values()
    assert state.reassembler.chunk_elems == 128 and len(pair.native.runs) == 1
    pair.feed([(grams[7:], seg)])
    assert pair.native.native == len(grams) - 7  # the rest taken, with the real geometry
    assert pair.outs[0] is not None and pair.outs[0].tobytes() == data.tobytes()


def test_a_posted_receive_cancelled_before_its_data_is_never_written() -> None:
    grams, _ = message(N, seed=23)
    seg = len(grams[0])
    pair = Pair(N, expect=True)
    for s in pair.sessions:
        assert s.cancel(0, step=STEP, msg=MSG, outgoing=False)
    assert len(pair.native.runs) == 0
    pair.feed([(grams[:40], seg), (grams[40:], seg)])
    assert pair.outs[0] is not None and np.isnan(pair.outs[0]).all()
    assert pair.native.session._inbox.stats.late_packets == len(grams)


def test_its_finish_before_its_data() -> None:
    """A FINISH that overtook all of the data waits as an orphan, and applies when
    the table's first run opens the message."""
    grams, finish = message(N, seed=24, p=0.05)
    seg = len(grams[0])
    pair = Pair(N, expect=True, ordered_paths=False)
    pair.control(finish)
    assert len(pair.native.runs) == 1
    pair.feed([(grams[:50], seg)])
    (state,) = pair.native.session._inbox._incoming.values()
    assert state.reassembler.finish is not None
    pair.feed([(grams[50:], seg)])
    assert pair.outs[0] is not None and pair.outs[0].tobytes() == _want(24)


def test_an_abort_before_its_data_unregisters_it() -> None:
    grams, _ = message(N, seed=25)
    seg = len(grams[0])
    pair = Pair(N, expect=True)
    tx = Session(rank=0, job=JOB, config=config())
    tx.send_message(1, np.zeros(N, np.float32), step=STEP, msg=MSG, now=0.0)
    tx.cancel(1, step=STEP, msg=MSG, outgoing=True)
    aborts = [item.data for item in tx.datagrams_to_send(now=0.0)
              if isinstance(item, ControlDatagram)]  # fmt: skip
    assert aborts
    pair.control(aborts)
    assert len(pair.native.runs) == 0
    pair.feed([(grams, seg)])
    assert pair.outs[0] is not None and np.isnan(pair.outs[0]).all()


def test_posting_again_without_a_buffer_unregisters_the_first() -> None:
    pair = Pair(N, expect=True)
    assert len(pair.native.runs) == 1
    for s in pair.sessions:
        s.expect_message(0, step=STEP, msg=MSG, out=None)
    assert len(pair.native.runs) == 0
    grams, _ = message(N, seed=26)
    pair.feed([(grams, len(grams[0]))])
    assert pair.outs[0] is not None and np.isnan(pair.outs[0]).all()
    (event,) = received_events(pair.native.session)
    assert event.data.tobytes() == _want(26)


def test_when_nothing_is_registered_before_the_data() -> None:
    """No guess for a buffer no message could have (empty), for a rank outside the
    session's peers (the receive is refused), nor on a session without the native
    loop (``native_receive`` off)."""
    s = Session(rank=1, job=JOB, config=config())
    s.expect_message(0, step=STEP, msg=MSG, out=np.empty(N, np.float32))
    assert s._inbox._expected[(0, STEP, MSG)].posted is None
    pair = Pair(N, expect=False)
    pair.native.session.expect_message(0, step=STEP, msg=MSG, out=np.empty(0, np.float32))
    assert len(pair.native.runs) == 0
    outsider = Session(rank=1, job=JOB, config=config(), peers=[2])
    runs = MessageRuns(JOB)
    outsider.take_runs_natively(runs)
    with pytest.raises(UsageError, match="not a peer"):
        outsider.expect_message(0, step=STEP, msg=MSG, out=np.empty(N, np.float32))
    outsider.expect_message(2, step=STEP, msg=MSG, out=np.empty(N, np.float32))
    assert len(runs) == 1  # rank 2's only


def test_the_bound_is_the_first_runs() -> None:
    """Runs of one call whose heads carry different bounds (a forged or corrupted
    one behind the first): the message opens with the first run's, as the first
    path opens it with its first datagram's."""
    grams, _ = message(N, seed=27, p=0.05)
    seg = len(grams[0])
    other = [g[:30] + bytes([bound_to_wire(0.2)]) + g[31:] for g in grams[5:10]]
    pair = Pair(N, expect=True)
    pair.feed([(grams[:5], seg), (other, seg)])
    (state,) = pair.native.session._inbox._incoming.values()
    assert state.reassembler.bound == bound_from_wire(bound_to_wire(0.05))


def test_an_unexpected_message_moves_to_the_buffer_its_receive_names() -> None:
    n = 20_000
    grams, _ = message(n, seed=12)
    seg = len(grams[0])
    pair = Pair(n, expect=False)
    pair.feed([(grams[:1], seg), (grams[1:100], seg)])
    outs = [np.full(n, np.nan, np.float32) for _ in range(2)]
    for s, out in zip(pair.sessions, outs, strict=True):
        s.expect_message(0, step=STEP, msg=MSG, out=out)
    pair.check()
    pair.feed([(grams[100:200], seg), (grams[200:], seg)])
    want = np.random.default_rng(12).standard_normal(n).astype(np.float32)
    assert outs[0].tobytes() == want.tobytes()
    assert pair.native.native == len(grams) - 1  # all but the first
