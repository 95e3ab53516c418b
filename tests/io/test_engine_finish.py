"""A round's FINISH written by the native engine's send thread (rule 9 of
``dlcp/io/_engine.c``, ``dlcp/io/_control_writes.h``): on real sockets, a round a
send thread completes writes the FINISH it was posted with on its rank's adopted
control connection and is reported without the eventfd; a round without one, or
one ``post`` sent itself, wakes Python and writes nothing; Python's frames and the
engine's never interleave, however the writes are cut; a write that fails or
finds no room in time is the connection's error from then on; bad arguments are
refused by name. Then two endpoints: their rounds' FINISHes go from the engine,
plain, authenticated and under loss, and the messages arrive whole."""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dlcp.io import Endpoint, EndpointConfig
from dlcp.io.engine import NativeSender, native_available
from dlcp.io.extensions import load
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.events import RoundPost
from tests.io.endpoint_helpers import KEY, LocalStore
from tests.io.test_engine_send import _engine, _pacer, _receive, _round, _sockets

pytestmark = pytest.mark.skipif(not native_available(), reason="native engine not built")

_FRAME = struct.Struct(">I")


@contextlib.contextmanager
def _control_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A TCP connection on the loopback: (the writer's end, the reader's end)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        writer = socket.create_connection(listener.getsockname())
        reader, _ = listener.accept()
    writer.setblocking(False)
    reader.settimeout(10.0)
    try:
        yield writer, reader
    finally:
        writer.close()
        reader.close()


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        assert chunk, "the connection ended"
        got += chunk
    return got


def _finish(tag: int, size: int = 40) -> bytes:
    """A frame as the control connection carries it (its length, then a body
    that says which it is)."""
    body = bytes([tag % 256]) * size
    return _FRAME.pack(len(body)) + body


def _woken(engine: Any) -> bool:
    return bool(select.select([engine.fileno()], [], [], 0)[0])


@pytest.mark.parametrize("threads", [1, 2])
def test_a_round_a_thread_sends_writes_its_finish_and_is_reported_without_a_wake_up(
    threads: int,
) -> None:
    with _sockets() as (rx, (tx,)), _control_pair() as (writer, reader):
        engine = _engine([tx.fileno()], 8, threads)  # (50 records: 7 batches, a thread's)
        try:
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            engine.adopt_control(1, writer.fileno())
            finish = _finish(7)
            assert engine.post(dst=1, step=3, msg=4, order=1, **_round(50, 900, 300),
                               finish=finish) is None  # fmt: skip
            _receive(rx, 50)
            assert _read_exactly(reader, len(finish)) == finish
            # queued before it was written: there now, and no eventfd written
            (report,) = engine.reap()
            assert not _woken(engine)
            dst, step, msg, failed, err, began_t, _, last_t, _, finish_sent, ended = report
            assert (dst, step, msg, failed, err, finish_sent) == (1, 3, 4, 0, 0, 1)
            assert ended >= last_t >= began_t
        finally:
            engine.close()  # (the thread counts the write once it has the lock back)
        stats = engine.stats()
        assert (stats["engine_finishes"], stats["engine_finish_errors"]) == (1, 0)


def test_without_an_adopted_connection_the_round_wakes_python_and_writes_nothing() -> None:
    with _sockets() as (rx, (tx,)), _control_pair() as (writer, reader):
        engine = _engine([tx.fileno()], 8)
        try:
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            for adopted in (False, True):  # never adopted; adopted, then released
                if adopted:
                    engine.adopt_control(1, writer.fileno())
                    engine.release_control(1)
                engine.post(dst=1, step=0, msg=int(adopted), order=1, **_round(50, 900, 300),
                            finish=_finish(1))  # fmt: skip
                _receive(rx, 50)
                assert select.select([engine.fileno()], [], [], 10)[0], "no wake-up"
                (report,) = engine.reap()
                assert report[9] == 0  # finish_sent
            reader.setblocking(False)
            with pytest.raises(BlockingIOError):
                reader.recv(1)
            assert engine.stats()["engine_finishes"] == 0
        finally:
            engine.close()


def test_a_round_post_sends_itself_leaves_its_finish_to_python() -> None:
    """Rule 7: a round of one batch goes from post(), whose report comes back at
    once: Python, awake anyway, writes the FINISH."""
    with _sockets() as (rx, (tx,)), _control_pair() as (writer, reader):
        engine = _engine([tx.fileno()], 352)
        try:
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            engine.adopt_control(1, writer.fileno())
            report = engine.post(dst=1, step=0, msg=0, order=1, **_round(3, 900, 300),
                                 finish=_finish(2))  # fmt: skip
            assert report is not None and report[9] == 0
            _receive(rx, 3)
            reader.setblocking(False)
            with pytest.raises(BlockingIOError):
                reader.recv(1)
        finally:
            engine.close()


@pytest.mark.parametrize("threads", [1, 2])
def test_frames_of_python_and_of_the_send_threads_never_interleave(threads: int) -> None:
    """Frames larger than the socket's buffer are cut into many writes, and both
    writers wait for room: every frame still arrives whole, each once. (A stream
    socket pair: its buffer bounds what waits unread, with no TCP timers.)"""
    rounds, python_frames, size = 20, 60, 20_000
    with _sockets() as (rx, (tx,)):
        writer, reader = socket.socketpair()
        writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        writer.setblocking(False)
        reader.settimeout(10.0)
        engine = _engine([tx.fileno()], 8, threads)
        frames: list[bytes] = []

        def read_all() -> None:
            while len(frames) < rounds + python_frames:
                (length,) = _FRAME.unpack(_read_exactly(reader, _FRAME.size))
                frames.append(_read_exactly(reader, length))

        reading = threading.Thread(target=read_all)
        reading.start()
        try:
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            engine.adopt_control(1, writer.fileno())
            for i in range(rounds):
                engine.post(dst=1, step=0, msg=i, order=i, **_round(20, 300, 300, seed=i),
                            finish=_finish(i, size))  # fmt: skip
            for j in range(python_frames):
                engine.control_send(1, _finish(100 + j, size))
            reading.join(timeout=60)
            assert not reading.is_alive(), f"{len(frames)} frames read"
        finally:
            engine.close()
            reading.join(timeout=10)
            writer.close()
            reader.close()
    expected = sorted([bytes([i]) * size for i in range(rounds)]
                      + [bytes([100 + j]) * size for j in range(python_frames)])  # fmt: skip
    assert sorted(frames) == expected


def test_a_failed_write_is_the_connections_error_from_then_on() -> None:
    """The peer closed its end: Python's write raises, every later one raises the
    same, and the send threads write no FINISH on it (their rounds wake Python,
    which drops the connection); a connection adopted anew takes frames again."""
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()], 8)
        mine, theirs = socket.socketpair()
        try:
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            engine.adopt_control(1, mine.fileno())
            theirs.close()
            with pytest.raises(BrokenPipeError):
                engine.control_send(1, _finish(1))
            with pytest.raises(BrokenPipeError):  # (no write tried: the connection's error)
                engine.control_send(1, _finish(2))
            engine.post(dst=1, step=0, msg=0, order=1, **_round(50, 900, 300), finish=_finish(3))
            _receive(rx, 50)
            assert select.select([engine.fileno()], [], [], 10)[0], "no wake-up"
            assert engine.reap()[0][9] == 0  # finish_sent
            engine.release_control(1)
            mine.close()
            mine, theirs = socket.socketpair()
            engine.adopt_control(1, mine.fileno())
            engine.control_send(1, _finish(4))
            assert theirs.recv(100) == _finish(4)
        finally:
            engine.close()
            mine.close()
            theirs.close()


def test_a_write_that_finds_no_room_in_time_fails_the_connection() -> None:
    native = load("_engine")  # (make sanitize: the build it names)

    mine, theirs = socket.socketpair()  # (nobody reads theirs)
    mine.setblocking(False)
    engine = native.Engine([mine.fileno()], 8, "dlcp-send-test", control_timeout=0.2)
    try:
        engine.adopt_control(0, mine.fileno())
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            engine.control_send(0, _finish(1, 4 << 20))
        assert time.monotonic() - began >= 0.2
        with pytest.raises(TimeoutError):  # (its stream is in doubt: nothing follows)
            engine.control_send(0, _finish(2))
    finally:
        engine.close()
        mine.close()
        theirs.close()


def test_bad_arguments_are_refused_by_name() -> None:
    native = load("_engine")  # (make sanitize: the build it names)

    with _sockets() as (rx, (tx,)):
        with pytest.raises(ValueError, match="control_timeout=0 outside"):
            native.Engine([tx.fileno()], 8, control_timeout=0.0)
        engine = _engine([tx.fileno()], 8)
        try:
            with pytest.raises(ValueError, match="adopt_control: rank -1 out of range"):
                engine.adopt_control(-1, tx.fileno())
            with pytest.raises(ValueError, match="adopt_control: descriptor -5"):
                engine.adopt_control(1, -5)
            with pytest.raises(OSError) as nothing:
                engine.control_send(3, b"frame")
            assert nothing.value.errno == errno.ENOTCONN
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            with pytest.raises(ValueError, match="post: finish of 0 bytes"):
                engine.post(dst=1, step=0, msg=0, order=1, **_round(5, 900, 300), finish=b"")
        finally:
            engine.close()


def test_the_sender_tracks_rounds_whose_reports_may_come_without_a_wake_up() -> None:
    """``NativeSender.quiet_due``: the earliest a quiet round's FINISH timer can be
    due, from its post and from the last reap that was told the time."""
    with _sockets() as (rx, (tx,)):
        data = SimpleNamespace(send_socks=[tx], use_gso=False)
        sender = NativeSender(data, ProtocolConfig(batch_packets=8))  # type: ignore[arg-type]
        try:
            sender._pacers[1] = _pacer(initial_rate=2000.0, min_rate=1000.0, burst_bytes=2000)
            r = _round(50, 900, 300)
            post = RoundPost(1, 0, 5, 0, 1, r["records"], 900, 50, r["short"], 300, r["tos"],
                             r["path"], r["prio"], r["breaks"], finish=b"finish")  # fmt: skip
            assert (sender.quiet, sender.quiet_due(0.2)) == (False, None)
            assert sender.post(post, ("127.0.0.1", rx.getsockname()[1]), now=100.0) is None
            assert sender.quiet and sender.quiet_due(0.2) == pytest.approx(100.2)
            assert sender.reap(now=150.0) == []  # (2 KB/s: 45 KB take 20 s)
            assert sender.quiet_due(0.2) == pytest.approx(150.2)
            assert sender.cancel(1, 0, 5)
            assert (sender.quiet, sender.quiet_due(0.2)) == (False, None)
        finally:
            sender.close()


def _pair(cfg: EndpointConfig, key: bytes | None = None) -> tuple[Endpoint, Endpoint]:
    store = LocalStore()
    a, b = (Endpoint(r, store=store, world_size=2, job=0x2A8, config=cfg, key=key)
            for r in range(2))  # fmt: skip
    return a, b


@pytest.mark.parametrize(
    "case",
    ["plain", "authenticated", "lossy"],
)
def test_endpoints_rounds_finish_from_the_engine_and_messages_arrive_whole(case: str) -> None:
    protocol = ProtocolConfig(authenticate=case == "authenticated")
    cfg = EndpointConfig(
        timeout=20.0, protocol=protocol, emulated_loss=0.05 if case == "lossy" else 0.0
    )
    a, b = _pair(cfg, KEY if case == "authenticated" else None)
    try:
        if a.engine != "native":
            pytest.skip("the native engine does not run here (authentication without libcrypto)")
        rng = np.random.default_rng(5)
        resent = 0
        for i in range(8):  # (8 MB: the receiver's work per message outlasts the round's end)
            x = rng.standard_normal(2_000_000).astype(np.float32)
            got = b.recv(src=0, msg=i, out=np.zeros_like(x))
            resent += a.send(x, to=1, msg=i).result(20).retransmitted_packets
            assert np.array_equal(got.result(20).data, x)
        # every frame counted once, whoever wrote it (and read it: the receive loop
        # drops FINISHes that came after their message completed): the last may still
        # be on its way
        def read(stats: dict[str, Any]) -> int:
            return int(stats["control_in"] + stats["control_finishes_native"])

        deadline = time.monotonic() + 10
        sa = a.stats()
        while (sa["engine_finishes"] < 1 or read(b.stats()) < sa["control_out"]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.01)  # polls counters; not a readiness wait
            sa = a.stats()
        assert sa["engine_finishes"] >= 1 and sa["engine_finish_errors"] == 0
        sb = b.stats()
        assert (read(sb), sb["control_rejected"]) == (sa["control_out"], 0)
        if case == "lossy":  # (NACKed after the engine's FINISHes, resent)
            assert resent > 0
    finally:
        a.close()
        b.close()
