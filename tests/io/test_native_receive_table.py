"""The native receive path's table (``dlcp.io._udpio.MessageTable``) driven by its
own calls: what it took is counted in its copies and not synced back, counts held
over steps are reported once, a removed message is never written (also while
another thread takes), bad arguments are named."""

from __future__ import annotations

import socket
import threading

import numpy as np
import numpy.typing as npt
import pytest

from dlcp.io import native_receive
from dlcp.io.native_receive import hand_over
from dlcp.proto.receive_paths import Taken
from tests.io.test_native_receive import MSG, NOW, STEP, message, registered
from tests.proto.session_helpers import JOB, config, received_events

pytestmark = pytest.mark.skipif(
    not native_receive.available(), reason="the native receive path was not built"
)


def test_what_the_table_took_is_not_synced_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table counts what it takes in its own copies of the completion counts:
    the session syncs them after data its Python paths took, not after the
    table's, and the message still completes when the table takes its last chunk."""
    grams, _ = message(1000, seed=15)
    seg = len(grams[0])
    runs, session, out = registered()
    synced: list[tuple[int, int, int]] = []
    real_sync = runs.sync
    monkeypatch.setattr(runs, "sync", lambda key, r: (synced.append(key), real_sync(key, r)))
    session.receive_batch(np.frombuffer(grams[0], np.uint8), seg, now=NOW)  # (Python opens it)
    assert len(runs) == 1 and len(synced) == 1
    raw = np.frombuffer(b"".join(grams[1:]), np.uint8).copy()
    runs.table.stage(raw, [(0, len(raw), seg)])

    class Taker:
        @staticmethod
        def taken(taken: list[Taken]) -> None:
            session.receive_taken(taken, now=NOW)

        @staticmethod
        def rest(buf: npt.NDArray[np.uint8], segment_size: int) -> None:
            raise AssertionError("every datagram fits the message")

    def deliver(buf: npt.NDArray[np.uint8], segment_size: int) -> None:
        raise AssertionError("the table takes every run")

    hand_over(runs.table, raw, deliver, Taker)
    assert len(synced) == 1  # nothing synced back after the table's takes
    (got,) = received_events(session)
    want = np.random.default_rng(15).standard_normal(1000).astype(np.float32)
    assert got.report.lost_elems == 0 and out.tobytes() == want.tobytes()


def test_counts_held_over_steps_are_reported_once() -> None:
    """``next(buf, False)`` keeps what it took in the table's counts, as a receive
    call's steps do; a later ``next`` reports them as one entry per message, and
    a run it hands over (here the check of the run that completes the message)
    comes with everything taken before it."""
    n_elems = config().chunk_bytes // 4 * 9  # (nine full datagrams: runs of one size)
    grams, _ = message(n_elems, seed=16)
    seg = len(grams[0])
    assert len(grams) == 9 and all(len(g) == seg for g in grams)
    runs, session, out = registered(n_elems)
    session.receive_batch(np.frombuffer(grams[0], np.uint8), seg, now=NOW)  # (opens it)
    table = runs.table

    def step(part: list[bytes]) -> npt.NDArray[np.uint8]:
        raw = np.frombuffer(b"".join(part), np.uint8).copy()
        table.stage(raw, [(0, len(raw), seg)])
        return raw

    for part in (grams[1:3], grams[3:5]):
        raw = step(part)
        assert table.next(raw, False) == (None, None)
    (held,) = table.next(raw)[1]
    assert held[:5] == (0, STEP, MSG, 4, 4 * seg)  # four datagrams, in one entry
    session.receive_taken([held], now=NOW)
    raw = step(grams[5:7])
    assert table.next(raw, False) == (None, None)
    raw = step(grams[7:])
    handover, taken = table.next(raw, False)
    assert handover == (len(raw), len(raw), seg, native_receive.TAKE_CHECK)
    assert [t[:5] for t in taken] == [(0, STEP, MSG, 4, 4 * seg)]
    session.receive_taken(taken, now=NOW)
    (got,) = received_events(session)
    want = np.random.default_rng(16).standard_normal(n_elems).astype(np.float32)
    assert got.report.lost_elems == 0 and out.tobytes() == want.tobytes()


def test_a_removed_message_is_never_written() -> None:
    """Runs staged while a message was registered, taken after it was removed: the
    table hands them over whole and writes nothing into its buffer."""
    grams, _ = message(1000, seed=14)
    seg = len(grams[0])
    runs, session, out = registered()
    session.receive_batch(np.frombuffer(grams[0], np.uint8), seg, now=NOW)
    assert len(runs) == 1
    raw = np.frombuffer(b"".join(grams[1:]), np.uint8).copy()
    runs.table.stage(raw, [(0, len(raw), seg)])
    before = out.copy()
    runs.unregister((0, STEP, MSG))
    assert runs.table.next(raw) == ((0, len(raw), seg, native_receive.TAKE_WHOLE), None)
    assert runs.table.next(raw) == (None, None)
    assert out.tobytes() == before.tobytes()


def test_bad_arguments_are_named() -> None:
    runs, _, out = registered()
    table = runs.table
    received = np.zeros(4, np.bool_)
    classes = np.zeros(4, np.uint8)
    with pytest.raises(ValueError, match=r"out holds 4000 bytes for 2000 elements"):
        table.register(0, 1, 2, out, received, classes, 500, 2000, 4, 0, False, False,
                       0, 0, 2000, 0)  # fmt: skip
    with pytest.raises(ValueError, match=r"received \(4\).*its 5 chunks"):
        table.register(0, 1, 2, out, received, classes, 200, 1000, 4, 0, False, False,
                       0, 0, 1000, 0)  # fmt: skip
    with pytest.raises(ValueError, match=r"message \(src 70000, step 1, msg 2\) out of range"):
        table.unregister(70000, 1, 2)
    with pytest.raises(ValueError, match=r"chunk_elems 0"):
        table.register(0, 1, 2, out, received, classes, 0, 1000, 4, 0, False, False, 0, 0, 1000, 0)
    with pytest.raises(ValueError, match=r"add needs float32 elements .* got itemsize 2"):
        table.register(0, 1, 2, out, received, classes, 500, 2000, 2, 0, False, True,
                       0, 0, 2000, 0)  # fmt: skip
    read_only = np.frombuffer(bytes(4000), np.float32)  # (the loop writes it)
    with pytest.raises((BufferError, ValueError), match="read-only"):
        table.register(0, 1, 2, read_only, received, classes, 250, 1000, 4, 0, False, False,
                       0, 0, 1000, 0)  # fmt: skip
    buf = np.zeros(100, np.uint8)
    with pytest.raises(ValueError, match="does not lie in the 100-byte buffer"):
        table.stage(buf, [(0, 101, 50)])
    with pytest.raises(ValueError, match="does not lie in the 100-byte buffer"):
        table.stage(buf, [(0, 100, 0)])
    with pytest.raises(ValueError, match="head_layout"):
        native_receive._udpio.MessageTable(JOB, 0x12, 3, b"\x00" * 7, bytes(32), bytes(8))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)  # (no step could read into 1000 bytes: it would spin)
        with pytest.raises(ValueError, match=r"read_size \(65536\) is larger than buf \(1000"):
            table.receive(sock.fileno(), np.empty(1000, np.uint8), 4 << 20, 100, 65536,
                          256 << 10, None)  # fmt: skip


def test_no_write_after_unregister_returns_while_another_thread_takes() -> None:
    """A thread takes a 25 MB run into a message while another removes it: once
    ``unregister`` has returned, nothing more is written into the message's buffer
    or chunk maps, whichever got the table first (it waits for a running step)."""
    n = 6_250_000
    grams, _ = message(n, seed=16)
    seg = len(grams[0])
    runs, session, out = registered(n)
    session.receive_batch(np.frombuffer(grams[0], np.uint8), seg, now=NOW)
    r = session._inbox._incoming[(0, STEP, MSG)].reassembler
    raw = np.frombuffer(b"".join(grams[1:]), np.uint8).copy()
    runs.table.stage(raw, [(0, len(raw), seg)])
    started = threading.Event()

    def take() -> None:
        started.set()
        runs.table.next(raw)

    taker = threading.Thread(target=take)
    taker.start()
    started.wait()
    while taker.is_alive() and not r.received[1:].any():
        pass  # (until the step writes: the chunk map is the signal)
    runs.unregister((0, STEP, MSG))
    received = r.received.copy()  # (first: the chunk map is quick to copy)
    snapshot = out.copy()
    taker.join()
    assert np.array_equal(r.received, received)
    assert out.tobytes() == snapshot.tobytes()
