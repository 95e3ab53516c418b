"""STOPs the receive loop's waits take themselves (``dlcp/io/_control_frames.h``,
``dlcp/io/_control_watch.h``, rule 10 of ``dlcp/io/_engine.c``,
``dlcp.io.control_in_waits``): the frames taken are exactly the untagged STOPs
``decode_control`` accepts from the connection's rank, in stream order with the
RATEs around them; a STOP taken while the loop lingers or waits stops the
engine's round of its message at once (no more of it goes, it is never
reported, Python's cancel takes it back) and is kept whole for Python's next
turn, which the wait ends by the hold; a caller that waits for a send wakes the
I/O thread while STOPs are kept; endpoints take them and deliver exactly."""

from __future__ import annotations

import contextlib
import random
import select
import selectors
import time
from typing import Any

import numpy as np
import pytest

from dlcp.io import native_receive
from dlcp.io.control_in_waits import ControlInWaits
from dlcp.io.engine import native_available
from dlcp.proto.control import RATE_SHARED, Stop, encode_control
from dlcp.proto.wire import VERSION, PacketType
from tests.io.test_engine_send import _engine, _pacer, _round, _sockets
from tests.io.test_linger_rates import (
    FIRST,
    JOB,
    SRC,
    Lingering,
    _udpio,
    framed,
    python_takes,
    rate,
)  # fmt: skip

pytestmark = pytest.mark.skipif(
    not (native_receive.available() and native_available()),
    reason="the native receive path or the native engine was not built",
)

STOP_FIRST = (VERSION << 4) | PacketType.STOP


def stop(step: int = 7, msg: int = 1, received: int = 10, *, src: int = SRC) -> bytes:
    return framed(encode_control(Stop(step, msg, src, received_elems=received), job=JOB))


def walked(stream: bytes, stop_first: int = STOP_FIRST) -> tuple[int, list[tuple[Any, ...]]]:
    consumed, frames = _udpio().control_frames(stream, JOB, FIRST, RATE_SHARED, SRC, stop_first)
    return int(consumed), list(frames)


def test_the_stops_taken_are_the_untagged_stops_decode_control_accepts() -> None:
    """Valid STOPs and every single-byte change of one: the walk takes a frame
    exactly when the Python path would apply it as a STOP from this rank, for
    the same message, and stops at the first it would not take; with STOPs off
    (first byte 0) it takes none."""
    rng = random.Random(11)
    base = stop(rng.randrange(1 << 32), rng.randrange(1 << 16), rng.randrange(1 << 32))
    frames = [base, stop(0, 0, 0), stop((1 << 32) - 1, (1 << 16) - 1), stop(src=SRC + 1),
              base[:-1], rate(1000)]  # fmt: skip
    for i in range(len(base)):
        for value in {0, 0x80, 0xFF, base[i] ^ 1}:
            frames.append(base[:i] + bytes([value]) + base[i + 1 :])
    for frame in frames:
        if len(frame) < 24:  # (cut short: nothing until the rest of it comes)
            assert walked(frame) == (0, []), frame.hex()
            continue
        want = python_takes(frame, SRC, Stop)
        consumed, got = walked(frame + base)
        if frame == rate(1000):
            assert consumed == 32 + 24 and got[0][0] == "rate" and got[1][0] == "stop"
        elif want is None:
            assert (consumed, got) == (0, []), frame.hex()
        else:
            assert consumed == 48 and got[0] == ("stop", want.step, want.msg), frame.hex()
        assert walked(frame + base, stop_first=0)[0] in (0, 32)  # (a RATE only)


def test_rates_and_stops_are_walked_in_stream_order_up_to_32() -> None:
    """RATEs, then STOPs, in stream order; a RATE behind a STOP taken is left (its
    pacer would hear it before the STOP, which Python applies later)."""
    stream = rate(1000) + rate(2000, shared=True) + stop(1, 2) + stop(3, 4)
    consumed, got = walked(stream + rate(3000))
    assert consumed == len(stream)
    assert [g[0] for g in got] == ["rate", "rate", "stop", "stop"]
    assert got[1][1:] == (2000.0, 0.005, True)
    assert got[2] == ("stop", 1, 2) and got[3] == ("stop", 3, 4)
    consumed, got = walked(stop() * 40)
    assert consumed == 32 * 24 and len(got) == 32


class Stopping(Lingering):
    """A lingering table that takes STOPs (``hold``), with a native engine that
    sends rank SRC's rounds paced by the pacer the table stops them through."""

    def __init__(self, hold: float) -> None:
        super().__init__()
        self.runs.take_stops(hold)
        # (10 KB/s, one 1 KB record a burst: a record every 0.1 s)
        self.pacer = _pacer(initial_rate=1e4, min_rate=1e3, burst_bytes=1000)
        self.runs.rate_pacer(SRC, self.pacer)
        self._udp = contextlib.ExitStack()
        self.rx, (tx,) = self._udp.enter_context(_sockets())
        self.engine = _engine([tx.fileno()], batch_packets=1)
        self.engine.add_peer(SRC, "127.0.0.1", self.rx.getsockname()[1], self.pacer)

    def close(self) -> None:
        self.engine.close()
        self._udp.close()
        super().close()


@pytest.fixture
def stopping():  # type: ignore[no-untyped-def]
    t = Stopping(hold=0.05)
    try:
        yield t
    finally:
        t.close()


def test_a_stop_taken_while_lingering_stops_the_round_and_is_kept_for_python(
    stopping: Stopping,
) -> None:
    """A round paced to 10 KB/s (a 1 KB record every 0.1 s): its first record goes,
    then its STOP comes while the loop lingers. The loop takes it (nothing left on
    the socket), ends the linger by the hold, not the call's 30 s, and keeps the
    datagram whole with its time; the engine sends nothing more of the round,
    never reports it, and cancel() takes it back."""
    t = stopping
    assert t.engine.post(dst=SRC, step=5, msg=9, order=1, **_round(40, 1000, 1000)) is None
    t.rx.settimeout(10.0)
    t.rx.recv(65536)  # (its first record: the round is under way)
    before = time.monotonic()
    t.ctl_w.sendall(stop(5, 9))
    assert t.receive(30.0) < 10.0
    assert t.left_on_socket() == b""
    assert t.runs.stops_taken == (1, 1) and t.runs.table.waiting(0) == 1
    ((src, datagram, taken_at),) = t.runs.stops()
    assert (src, datagram) == (SRC, stop(5, 9)[4:]) and before <= taken_at <= time.monotonic()
    assert t.runs.stops() == [] and t.runs.table.waiting(0) == 0
    t.rx.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:  # (what went before the STOP)
            t.rx.recv(65536)
    # at 10 KB/s the next record was due within 0.1 s: 0.5 s brings none
    assert not select.select([t.rx], [], [], 0.5)[0], "the stopped round sent on"
    assert not select.select([t.engine.fileno()], [], [], 0)[0] and t.engine.reap() == []
    assert t.engine.cancel(SRC, 5, 9) is True


def test_a_stop_for_no_round_is_kept_and_stops_nothing(stopping: Stopping) -> None:
    t = stopping
    t.ctl_w.sendall(rate(5000) + stop(1, 1))
    t.receive(0.05)
    assert t.runs.stops_taken == (1, 0) and t.runs.rates_taken == 1
    assert [s[1] for s in t.runs.stops()] == [stop(1, 1)[4:]]


def test_rates_behind_a_kept_stop_wait_for_python(stopping: Stopping) -> None:
    """While a STOP from a source is kept, that source's RATEs stay on the socket
    (in the same walk or a later wait): Python reads them after it applied the STOP,
    as it would have read them in stream order."""
    t = stopping
    t.ctl_w.sendall(stop(1, 1) + rate(5000))
    assert t.receive(30.0) < 10.0
    assert t.runs.stops_taken == (1, 0) and t.runs.rates_taken == 0
    assert t.left_on_socket() == rate(5000)
    t.ctl_w.sendall(rate(6000))
    assert t.receive(30.0) < 10.0 and t.left_on_socket() == rate(6000)
    assert len(t.runs.stops()) == 1  # (Python's turn took it: RATEs are taken again)
    t.ctl_w.sendall(rate(7000))
    t.receive(0.05)
    assert t.runs.rates_taken == 1 and t.left_on_socket() == b""


def test_the_i_o_threads_wait_takes_a_stop_and_ends_by_the_hold(stopping: Stopping) -> None:
    """The selector's wait through the table: a STOP on a watched connection is
    taken and the wait ends by the hold (50 ms), not its 30 s timeout, with
    nothing ready; the next wait, the stash taken, lasts its timeout."""
    from dlcp.io.readiness import ReadSelector

    t = stopping
    sel = ReadSelector()
    try:
        sel.register(t.ctl_r, selectors.EVENT_READ, "control")
        sel.wait_with(t.runs.table.wait)
        t.ctl_w.sendall(stop(2, 3))
        start = time.monotonic()
        assert sel.select(30.0) == []
        assert 0.04 <= time.monotonic() - start < 10.0
        assert [s[1] for s in t.runs.stops()] == [stop(2, 3)[4:]]
        start = time.monotonic()
        assert sel.select(0.1) == [] and time.monotonic() - start >= 0.1
    finally:
        sel.close()


def test_while_a_caller_waits_for_a_send_stops_are_left_to_python(stopping: Stopping) -> None:
    """A caller that begins to wait while a STOP is kept wakes the I/O thread;
    while one waits, a STOP stays on the socket (it ends the wait, for Python's
    turn to settle the send at once); when none waits any more, they are taken."""
    from dlcp.io.engine import _native

    t = stopping
    woken: list[int] = []
    waits = ControlInWaits(t.runs, _native.PACER_API, JOB, lambda: woken.append(1))
    waits.waiting(1)
    waits.waiting(-1)
    assert woken == []  # (nothing kept)
    t.ctl_w.sendall(stop(4, 4))
    t.receive(30.0)
    assert t.runs.table.waiting(0) == 1
    waits.waiting(1)
    assert woken == [1]
    assert len(waits.stops()) == 1
    t.ctl_w.sendall(stop(4, 5))
    assert t.receive(30.0) < 10.0
    assert t.left_on_socket() == stop(4, 5) and waits.stops() == []
    waits.waiting(-1)
    t.ctl_w.sendall(stop(4, 6))
    t.receive(30.0)
    assert t.left_on_socket() == b"" and len(waits.stops()) == 1


def test_bad_arguments_are_named() -> None:
    from dlcp.io.udp import DataSockets

    socks = DataSockets("127.0.0.1", 0, 1, gso="off", gro="off", rcvbuf=1 << 20, sndbuf=1 << 20)
    try:
        table = socks.take_runs(JOB).table
        with pytest.raises(RuntimeError, match="take_stops: call take_rates first"):
            table.take_stops(STOP_FIRST, 0)
        with pytest.raises(ValueError, match="first byte 300 or hold_ns -1 out of range"):
            table.take_stops(300, -1)
    finally:
        socks.close()


@pytest.mark.integration
def test_endpoints_take_stops_in_their_waits_and_deliver_exactly() -> None:
    """Two native endpoints on the loopback, messages one way: the sender's waits
    take some of the receiver's STOPs, each send's future settles with its
    report, and every message arrives exact."""
    from tests.io.test_engines import _data, pair, transfer

    with pair(("native", "native"), receive_linger=0.01) as (a, b):
        for msg in range(12):
            data = _data(msg)
            received, sent, out = transfer(a, b, data, msg=msg, p=0.0)
            assert np.array_equal(out, data) and received.report.lost_elems == 0
            assert sent.acknowledged_elems == data.size
        stats = a.stats()
        assert stats["control_stops_native"] > 0
        assert stats["stale_control"] == 0



@pytest.mark.integration
def test_a_stop_kept_when_the_endpoint_closes_settles_its_send() -> None:
    """A send nobody waits for, whose STOP the sender's waits keep (a hold of 60 s
    here) when the sender closes: its future gets the report, not the endpoint's
    closing error (the turn that the close wakes the I/O thread for applies it; a STOP
    kept during that turn is applied as the thread ends)."""
    from tests.io.test_engines import _data, pair

    kept = False
    with pair(("native", "native"), receive_linger=0.01) as (a, b):
        waits = a._in_waits
        assert waits is not None
        waits._runs.take_stops(60.0)
        for msg in range(20):
            data = _data(msg)
            incoming = b.recv(src=a.rank, msg=msg, out=np.empty_like(data))
            sent = a.send(data, to=b.rank, msg=msg, p=0.0)
            incoming.result(30.0)
            deadline = time.monotonic() + 30.0
            while not sent.done() and waits._runs.table.waiting(0) == 0:
                assert time.monotonic() < deadline, "the STOP neither came nor was kept"
                time.sleep(0.001)
            if not sent.done():
                kept = True
                break
        assert kept, "every STOP was applied before it could be seen kept"
        a.close()
        assert sent.result(0).acknowledged_elems == data.size
