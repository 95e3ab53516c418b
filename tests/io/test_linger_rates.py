"""RATE reports the receive loop's linger hands to the native engine's pacers
(``dlcp/io/_control_frames.h``, ``dlcp.io.control_in_waits``): the frames it takes are
exactly the untagged RATEs ``decode_control`` accepts from the connection's rank;
while it lingers, a watched connection's leading RATE frames reach their pacer as
the Python path would apply them and the linger goes on; anything else stays on
the socket for Python and ends the linger; endpoints take them and still deliver."""

from __future__ import annotations

import random
import select
import selectors
import socket
import struct
import time
from typing import Any

import numpy as np
import pytest

from dlcp.io import native_receive
from dlcp.io.engine import native_available
from dlcp.io.udp import DataSockets
from dlcp.proto.control import RATE_SHARED, RateFeedback, Stop, decode_control, encode_control
from dlcp.proto.wire import VERSION, Flags, PacketType, WireError

pytestmark = pytest.mark.skipif(
    not (native_receive.available() and native_available()),
    reason="the native receive path or the native engine was not built",
)

JOB, SRC = 42, 3
FIRST = (VERSION << 4) | PacketType.RATE


def _udpio() -> Any:
    """The receive loop's extension as the endpoint loads it (a sanitized build
    where ``DLCP_UDPIO_BUILD`` names one)."""
    return native_receive._udpio


def framed(datagram: bytes) -> bytes:
    return struct.pack(">I", len(datagram)) + datagram


def rate(bytes_per_s: int, interval_us: int = 5000, *, src: int = SRC, shared: bool = False,
         job: int = JOB) -> bytes:  # fmt: skip
    msg = RateFeedback(0, 0, src, bytes_per_s=bytes_per_s, interval_us=interval_us, shared=shared)
    return framed(encode_control(msg, job=job))


def stop(src: int = SRC) -> bytes:
    return framed(encode_control(Stop(7, 1, src, received_elems=10), job=JOB))


def taken(stream: bytes, src: int = SRC) -> tuple[int, list[tuple[float, float, bool]]]:
    consumed, frames = _udpio().control_frames(stream, JOB, FIRST, RATE_SHARED, src)
    assert all(f[0] == "rate" for f in frames)  # (STOPs are Python's unless asked for)
    return int(consumed), [tuple(f[1:]) for f in frames]


def python_takes(frame: bytes, src: int, kind: type[Any] = RateFeedback) -> Any:
    """What the Python path makes of one frame: the message of type ``kind`` (RATE
    by default) it applies, or None (another message, another rank, a refused or
    tagged datagram)."""
    (length,) = struct.unpack_from(">I", frame)
    datagram = frame[4:]
    if length != len(datagram) or len(datagram) < 12:
        return None
    if struct.unpack_from(">H", datagram, 10)[0] != src:
        return None
    try:
        ctrl = decode_control(datagram, job=JOB)
    except WireError:
        return None
    if not isinstance(ctrl, kind) or datagram[1] & Flags.AUTH:
        return None
    return ctrl


def test_the_frames_taken_are_the_untagged_rates_decode_control_accepts() -> None:
    """Valid RATEs and every single-byte change of one (and cut frames, other
    messages, other ranks behind them): the loop takes a frame exactly when the
    Python path would apply it as a RATE from this rank, with the same values,
    and stops at the first it would not take."""
    rng = random.Random(5)
    good = [rate(rng.randrange(1 << 40), rng.randrange(1 << 32), shared=rng.random() < 0.5)
            for _ in range(3)]  # fmt: skip
    base = good[0]
    frames = [*good, rate(1 << 63, 0), rate((1 << 64) - 1, (1 << 32) - 1), stop(), rate(1, src=4),
              rate(5, job=JOB + 1), base[:-1], b""]  # fmt: skip
    for i in range(len(base)):
        for value in {0, 0x80, 0xFF, base[i] ^ 1}:
            frames.append(base[:i] + bytes([value]) + base[i + 1 :])
    for frame in frames:
        if len(frame) < 32:  # (cut short: nothing until the rest of it comes)
            assert taken(frame) == (0, []), frame.hex()
            continue
        want = python_takes(frame, SRC)
        consumed, reports = taken(frame + base)  # (a good frame after it: not taken if it stops)
        if want is None:
            assert (consumed, reports) == (0, []), frame.hex()
        else:
            assert consumed == 64 and len(reports) == 2, frame.hex()
            assert reports[0] == (float(want.bytes_per_s), want.interval_us * 1e-6, want.shared)
    consumed, reports = taken(b"".join(good) + stop() + good[0])
    assert consumed == 3 * 32 and len(reports) == 3


def test_a_walk_takes_at_most_32_frames() -> None:
    consumed, reports = taken(rate(1000) * 40)
    assert consumed == 32 * 32 and len(reports) == 32


class Lingering:
    """A MessageTable whose receive call lingers on an empty data socket, with a
    control connection (a stream socket pair) in the watched epoll set, the
    native engine's pacer for SRC, and a twin pacer the Python path would feed."""

    def __init__(self) -> None:
        from dlcp.io.engine import _native_pacer

        self.socks = DataSockets(
            "127.0.0.1", 0, 1, gso="off", gro="off", rcvbuf=1 << 20, sndbuf=1 << 20
        )
        self.runs = self.socks.take_runs(JOB)
        self.ctl_r, self.ctl_w = socket.socketpair()
        self.epoll = select.epoll()
        self.epoll.register(self.ctl_r.fileno(), select.EPOLLIN)
        self.pacer, self.twin = _native_pacer(), _native_pacer()
        from dlcp.io.engine import _native  # (the engine as endpoints load it)

        assert _native is not None
        self.runs.take_rates(_native.PACER_API, JOB)
        self.runs.rate_pacer(SRC, self.pacer)
        self.runs.watch_control(self.ctl_r.fileno(), SRC)

    def receive(self, linger: float) -> float:
        """One receive call with this linger; how long it took."""
        start = time.monotonic()
        self.socks.receive(lambda b, s: None, taken=_NoRuns(), linger=linger,
                           watch=self.epoll.fileno())  # fmt: skip
        return time.monotonic() - start

    def left_on_socket(self) -> bytes:
        self.ctl_r.setblocking(False)
        try:
            return self.ctl_r.recv(1 << 16)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        self.epoll.close()
        self.ctl_r.close()
        self.ctl_w.close()
        self.socks.close()


class _NoRuns:
    def taken(self, taken: object) -> None:
        raise AssertionError("no data was sent")

    def rest(self, buf: object, segment_size: int) -> None:
        raise AssertionError("no data was sent")


@pytest.fixture
def lingering():  # type: ignore[no-untyped-def]
    t = Lingering()
    try:
        yield t
    finally:
        t.close()


def test_rates_read_while_lingering_reach_the_pacer_and_the_linger_goes_on(
    lingering: Lingering,
) -> None:
    """Two RATE frames queued on a watched connection: the lingering call takes
    them (the socket is left empty), the pacer follows them as the same reports
    applied by the Python path make its twin follow, and the call lingers to its
    end instead of returning for them."""
    t = lingering
    reports = [(2_000_000, 5000), (1_500_000, 20000)]
    t.ctl_w.sendall(b"".join(rate(r, w) for r, w in reports))
    linger = 0.05
    took = t.receive(linger)
    assert took >= linger and t.socks.lingered >= linger / 2
    assert t.left_on_socket() == b""
    assert t.runs.rates_taken == 2
    for r, w in reports:
        t.twin.on_feedback(float(r), now=time.monotonic(), window=w * 1e-6)
    assert t.pacer.rate == t.twin.rate != _fresh_rate()


def _fresh_rate() -> float:
    from dlcp.io.engine import _native_pacer

    return float(_native_pacer().rate)


@pytest.mark.parametrize("watched", [True, False])
def test_anything_else_stays_for_python_and_ends_the_linger(
    lingering: Lingering, watched: bool
) -> None:
    """A RATE then a STOP: the RATE is taken, the STOP stays on the socket whole
    and ends the linger at once. A connection that is not watched (Python holds
    part of its stream) is not read at all."""
    t = lingering
    if not watched:
        t.runs.unwatch_control(t.ctl_r.fileno())
    t.ctl_w.sendall(rate(3_000_000) + stop())
    took = t.receive(30.0)
    assert took < 30.0
    assert t.runs.rates_taken == (1 if watched else 0)
    assert t.left_on_socket() == (stop() if watched else rate(3_000_000) + stop())


def test_a_rate_from_another_rank_or_a_cut_frame_stays_for_python(lingering: Lingering) -> None:
    t = lingering
    t.ctl_w.sendall(rate(1000, src=SRC + 1))
    assert t.receive(30.0) < 30.0 and t.runs.rates_taken == 0
    assert t.left_on_socket() == rate(1000, src=SRC + 1)
    t.ctl_w.sendall(rate(1000)[:20])
    assert t.receive(30.0) < 30.0 and t.runs.rates_taken == 0
    assert t.left_on_socket() == rate(1000)[:20]


def test_a_source_without_a_pacer_is_left_to_python(lingering: Lingering) -> None:
    t = lingering
    t.runs.rate_pacer(SRC, None)
    t.ctl_w.sendall(rate(1000))
    assert t.receive(30.0) < 30.0 and t.runs.rates_taken == 0
    assert t.left_on_socket() == rate(1000)


def test_the_i_o_threads_wait_takes_rates_and_returns_what_else_is_ready(
    lingering: Lingering,
) -> None:
    """The I/O thread's selector waiting through the table (``wait_with``): a RATE
    on a watched connection is taken and the wait goes on to its timeout; a STOP
    behind nothing else makes the connection ready, left on the socket whole."""
    from dlcp.io.readiness import ReadSelector

    t = lingering
    sel = ReadSelector()
    try:
        key = sel.register(t.ctl_r, selectors.EVENT_READ, "control")
        sel.wait_with(t.runs.table.wait)
        t.ctl_w.sendall(rate(2_000_000))
        start = time.monotonic()
        assert sel.select(0.05) == []
        assert time.monotonic() - start >= 0.05
        assert t.runs.rates_taken == 1 and t.left_on_socket() == b""
        t.ctl_w.sendall(rate(1_000_000) + stop())
        assert sel.select(None) == [(key, selectors.EVENT_READ)]
        # (the longest timeout there is: the STOP is still there, the wait ends at once)
        assert t.runs.table.wait(t.epoll.fileno(), (1 << 63) - 1, 4) == [t.ctl_r.fileno()]
        assert t.runs.rates_taken == 2 and t.left_on_socket() == stop()
    finally:
        sel.close()


def test_bad_arguments_are_named(lingering: Lingering) -> None:
    table = lingering.runs.table
    with pytest.raises(TypeError, match="rate_pacer: a native engine's Pacer, not int"):
        table.rate_pacer(1, 5)
    with pytest.raises(ValueError, match="rank 70000 out of range"):
        table.rate_pacer(70000, None)
    with pytest.raises(ValueError, match="watch_control: descriptor -1 or rank 1 out of range"):
        table.watch_control(-1, 1)
    with pytest.raises(TypeError, match=r"take_rates: pacer_api must be dlcp\.io\._engine\."
                       r"PACER_API, not object"):  # fmt: skip
        table.take_rates(object(), JOB, FIRST, RATE_SHARED)
    with pytest.raises(ValueError, match="job 70000, first byte 21 or shared_flag 1 out of range"):
        table.take_rates(None, 70000, FIRST, RATE_SHARED)
    fresh = DataSockets("127.0.0.1", 0, 1, gso="off", gro="off", rcvbuf=1 << 20, sndbuf=1 << 20)
    try:
        with pytest.raises(RuntimeError, match="rate_pacer: call take_rates first"):
            fresh.take_runs(JOB).table.rate_pacer(1, None)
    finally:
        fresh.close()
    assert table.unwatch_control(12345) is False


@pytest.mark.integration
@pytest.mark.parametrize("authenticate", [False, True])
def test_endpoints_take_rates_in_the_linger_and_deliver_exactly(authenticate: bool) -> None:
    """Two native endpoints on the loopback, messages one way: the sender's
    linger takes some of the receiver's RATE reports itself and every message
    arrives exact; an authenticating pair too (tagged RATEs whose tags verify)."""
    from dlcp.io.engine import native_seals
    from dlcp.proto.config import ProtocolConfig
    from tests.io.test_engines import _data, pair, transfer

    if authenticate and not (native_seals() and native_receive.verifies_tags()):
        pytest.skip("native engine or receive loop built without libcrypto")
    auth: dict[str, Any] = {}
    if authenticate:
        auth = {"key": lambda src, dst: bytes([src, dst]) * 16,
                "protocol": ProtocolConfig(authenticate=True)}  # fmt: skip
    with pair(("native", "native"), receive_linger=0.01, **auth) as (a, b):
        for msg in range(12):
            data = _data(msg)
            received, _, out = transfer(a, b, data, msg=msg, p=0.0)
            assert np.array_equal(out, data) and received.report.lost_elems == 0
        assert a.stats()["control_rates_native"] > 0
