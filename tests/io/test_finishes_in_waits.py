"""FINISHes the receive loop drops in its waits (``dlcp/io/_control_frames.h``,
``dlcp/io/_control_watch.h``, ``dlcp.io.control_in_waits``): the frames it may take
are exactly the untagged FINISHes ``decode_control`` accepts and the inbox does
not refuse; a FINISH is dropped only for a message that completed here less than
the crossing window ago, of the last ones that ended (not one that failed, is
unknown, was forgotten or completed too long ago: those the inbox answers, and
they end the wait as before); endpoints drop them and deliver exactly."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from dlcp.io import native_receive
from dlcp.io.engine import native_available
from dlcp.proto.control import RATE_SHARED, Finish, encode_control
from dlcp.proto.wire import VERSION, PacketType
from tests.io.test_linger_rates import (
    FIRST,
    JOB,
    SRC,
    Lingering,
    _udpio,
    framed,
    python_takes,
    rate,
)

pytestmark = pytest.mark.skipif(
    not (native_receive.available() and native_available()),
    reason="the native receive path or the native engine was not built",
)

FINISH_FIRST = (VERSION << 4) | PacketType.FINISH


def finish(step: int = 3, msg: int = 4, *, tail: tuple[int, ...] = (9,), src: int = SRC,
           total: int = 10) -> bytes:  # fmt: skip
    protected = min(4, total)
    classes = (protected, total - protected) + (0,) * 14
    body = Finish(step, msg, src, round=1, total_chunks=total, protected_chunks=protected,
                  class_chunks=classes, tail=tail)  # fmt: skip
    return framed(encode_control(body, job=JOB))


def walked(stream: bytes) -> tuple[int, list[tuple[object, ...]]]:
    consumed, frames = _udpio().control_frames(stream, JOB, FIRST, RATE_SHARED, SRC, 0,
                                               FINISH_FIRST)  # fmt: skip
    return int(consumed), list(frames)


def test_the_finishes_taken_are_the_untagged_finishes_decode_control_accepts() -> None:
    """Valid FINISHes (no tail, one, 256) and every single-byte change of one: the
    walk takes a frame exactly when the Python path would apply it as a FINISH
    from this rank with chunks in it, and stops at the first it would not."""
    rng = random.Random(3)
    base = finish(rng.randrange(1 << 32), rng.randrange(1 << 16), tail=(0, 7, 9))
    frames = [base, finish(tail=()), finish(tail=tuple(range(256)), total=300),
              finish(src=SRC + 1), finish(total=0, tail=()), base[:-1], rate(1000)]  # fmt: skip
    for i in range(len(base)):
        for value in {0, 0x80, 0xFF, base[i] ^ 1}:
            frames.append(base[:i] + bytes([value]) + base[i + 1 :])
    for frame in frames:
        if frame == rate(1000):
            continue
        if int.from_bytes(frame[:4], "big") != len(frame) - 4:
            # (a frame cut short, or whose length says otherwise: alone it is not taken;
            # in a stream, the bytes after it are its rest)
            assert walked(frame) == (0, []), frame.hex()
            continue
        want = python_takes(frame, SRC, Finish)
        if want is not None and want.total_chunks == 0:
            want = None  # (the inbox refuses it: its reject count says so)
        consumed, got = walked(frame + base)
        if want is None:
            assert (consumed, got) == (0, []), frame.hex()
        else:
            assert consumed == len(frame) + len(base), frame.hex()
            assert got[0] == ("finish", want.step, want.msg), frame.hex()
    # (behind RATEs, in stream order)
    consumed, got = walked(rate(1000) + finish(5, 6) + rate(2000))
    assert [g[0] for g in got] == ["rate", "finish", "rate"] and got[1][1:] == (5, 6)


class Crossing(Lingering):
    """A lingering table that drops the FINISHes of messages that completed within
    ``crossed`` seconds, of the last ``keys`` that ended."""

    def __init__(self, crossed: float = 30.0, keys: int = 4) -> None:
        super().__init__()
        self.runs.take_finishes(crossed, keys)

    @property
    def dropped(self) -> int:
        return self.runs.finishes_taken


@pytest.fixture
def crossing():  # type: ignore[no-untyped-def]
    t = Crossing()
    try:
        yield t
    finally:
        t.close()


def test_a_finish_for_a_message_that_completed_here_is_dropped_and_the_wait_goes_on(
    crossing: Crossing,
) -> None:
    t = crossing
    t.runs.ended((SRC, 3, 4), time.monotonic())
    t.ctl_w.sendall(finish(3, 4) + rate(5000))
    linger = 0.05
    assert t.receive(linger) >= linger
    assert t.left_on_socket() == b""
    assert t.dropped == 1 and t.runs.rates_taken == 1


@pytest.mark.parametrize("why", ["unknown", "failed", "too old", "another rank"])
def test_any_other_finish_stays_for_python_and_ends_the_wait(crossing: Crossing, why: str) -> None:
    t = crossing
    now = time.monotonic()
    if why == "failed":
        t.runs.ended((SRC, 3, 4), None)
    elif why == "too old":  # (the inbox answers it with a STOP again)
        t.runs.ended((SRC, 3, 4), now - 60.0)
    elif why == "another rank":
        t.runs.ended((SRC + 1, 3, 4), now)
    t.ctl_w.sendall(finish(3, 4))
    assert t.receive(30.0) < 10.0
    assert t.left_on_socket() == finish(3, 4) and t.dropped == 0


def test_the_loop_forgets_the_oldest_ended_messages_beyond_its_keys(crossing: Crossing) -> None:
    t = crossing
    now = time.monotonic()
    for msg in range(5):  # (4 keys: message 0 is forgotten)
        t.runs.ended((SRC, 3, msg), now)
    t.ctl_w.sendall(finish(3, 4) + finish(3, 1))
    t.receive(0.05)
    assert t.dropped == 2 and t.left_on_socket() == b""
    t.ctl_w.sendall(finish(3, 0))
    assert t.receive(30.0) < 10.0 and t.left_on_socket() == finish(3, 0)


def test_absorb_takes_what_a_wait_would(crossing: Crossing) -> None:
    t = crossing
    t.runs.ended((SRC, 3, 4), time.monotonic())
    t.ctl_w.sendall(finish(3, 4))
    assert _wait_readable(t) and t.runs.table.absorb(t.ctl_r.fileno()) is True
    t.ctl_w.sendall(finish(3, 5))
    assert _wait_readable(t) and t.runs.table.absorb(t.ctl_r.fileno()) is False
    assert t.left_on_socket() == finish(3, 5) and t.dropped == 1


def _wait_readable(t: Lingering) -> bool:
    import select

    return bool(select.select([t.ctl_r], [], [], 10.0)[0])


def test_bad_arguments_are_named(crossing: Crossing) -> None:
    table = crossing.runs.table
    bad = r"crossed_ns -1 or keys 0 out of range \(keys: 1 to 256\)"
    with pytest.raises(ValueError, match=bad):
        table.take_finishes(FINISH_FIRST, -1, 0)
    with pytest.raises(ValueError, match="ended: rank 70000, step 1, msg 2 or time out of range"):
        table.ended(70000, 1, 2, 0.0)
    with pytest.raises(ValueError, match="or time out of range"):
        table.ended(1, 1, 2, float("nan"))


@pytest.mark.integration
def test_endpoints_drop_crossed_finishes_and_deliver_exactly() -> None:
    """Two native endpoints on the loopback, messages one way: the receiver drops
    the FINISHes that come after its messages completed, rejects nothing, and every
    message arrives exact; its session still reads the rest."""
    from tests.io.test_engines import _data, pair, transfer

    with pair(("native", "native"), receive_linger=0.01) as (a, b):
        for msg in range(12):
            data = _data(msg)
            received, sent, out = transfer(a, b, data, msg=msg, p=0.0)
            assert np.array_equal(out, data) and received.report.lost_elems == 0
            assert sent.acknowledged_elems == data.size
        stats = b.stats()
        assert stats["control_finishes_native"] > 0
        assert stats["control_rejected"] == 0 and not stats["rejected"]
