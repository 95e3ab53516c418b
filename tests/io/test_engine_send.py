"""The native send engine (``dlcp.io._engine.Engine``) on real loopback UDP
sockets: a posted round arrives as its records, in order, with the last record
short; runs of records on other paths leave from other sockets; a round is
reported once, when sent or when its send failed; ``cancel`` takes a round
back; bad posts are refused by name. The tests where it matters run the engine
with 1, 2 and 4 send threads (``THREADS``): with more than one, several batches
of one round may be on their way at once, and leave in any order. (The
endpoint tests run on this engine by default; ``test_engines.py`` checks it
against the Python engine.)"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlcp.io.engine import native_available
from dlcp.io.extensions import load

pytestmark = pytest.mark.skipif(not native_available(), reason="native engine not built")


#: the engine's send threads in the tests that run with each
THREADS = [1, 2, 4]


def _engine(fds: list[int], batch_packets: int = 352, threads: int = 1) -> Any:
    _engine = load("_engine")  # (make sanitize: the build it names)

    return _engine.Engine(fds, batch_packets, "dlcp-send-test", threads=threads)


def _pacer(**options: Any) -> Any:
    _engine = load("_engine")  # (make sanitize: the build it names)

    return _engine.Pacer(**options)


@contextlib.contextmanager
def _sockets(n_send: int = 1) -> Iterator[tuple[socket.socket, list[socket.socket]]]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind(("127.0.0.1", 0))
    txs = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n_send)]
    for s in txs:
        s.bind(("127.0.0.1", 0))
    try:
        yield rx, txs
    finally:
        for s in (rx, *txs):
            s.close()


def _round(count: int, stride: int, short_len: int, seed: int = 0) -> dict[str, Any]:
    records = np.random.default_rng(seed).integers(0, 256, (count, stride), dtype=np.uint8)
    return {
        "records": records,
        "stride": stride,
        "per_message": 1,
        "count": count,
        "short": count - 1 if short_len < stride else -1,
        "short_len": short_len,
        "tos": np.zeros(count, np.uint8),
        "path": np.zeros(count, np.uint8),
        "prio": np.zeros(count, np.uint8),
        "breaks": np.array([count], np.int64),
    }


def _wait_report(engine: Any, timeout: float = 10.0) -> list[Any]:
    ready, _, _ = select.select([engine.fileno()], [], [], timeout)
    assert ready, "the engine reported nothing"
    return list(engine.reap())


def _post(engine: Any, **round_: Any) -> list[Any]:
    """Post a round and get its report: from post() when the pacer let all of it
    go at once (rule 7), else from reap() once the engine's thread is done."""
    ended = engine.post(**round_)
    return [ended] if ended is not None else _wait_report(engine)


def _receive(rx: socket.socket, n: int) -> list[tuple[bytes, int]]:
    rx.settimeout(5.0)
    got = []
    for _ in range(n):
        data, addr = rx.recvfrom(65536)
        got.append((data, addr[1]))
    return got


def _record_index(r: dict[str, Any], got: list[tuple[bytes, int]]) -> list[int]:
    """Which record of round ``r`` each received datagram is (every record of a
    ``_round`` differs from the others), asserting that it is one."""
    index = {r["records"][i, : r["short_len"] if i == r["short"] else r["stride"]].tobytes(): i
             for i in range(r["count"])}  # fmt: skip
    assert all(data in index for data, _ in got), "a datagram that is no record of the round"
    return [index[data] for data, _ in got]


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize(("per_message", "batch_packets"), [(1, 352), (8, 5), (44, 1)])
def test_a_round_arrives_as_its_records_in_order(
    per_message: int, batch_packets: int, threads: int
) -> None:
    """Every record arrives once; in order with one send thread, and with more
    in order within each batch (batches of one round may leave side by side)."""
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()], batch_packets, threads)
        try:
            engine.add_peer(3, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            r = _round(count=50, stride=1000, short_len=123)
            report = _post(engine, dst=3, step=7, msg=2, order=1,
                           **{**r, "per_message": per_message})
            got = _receive(rx, 50)
        finally:
            engine.close()
    order = _record_index(r, got)
    assert sorted(order) == list(range(50))
    if threads == 1:
        assert order == list(range(50))
    else:  # (one thread sends a batch: its records leave in order, perhaps between
        # another thread's, as sendmmsg is a sendmsg per message)
        for i in range(0, 50, batch_packets):
            batch = [order.index(j) for j in range(i, min(i + batch_packets, 50))]
            assert batch == sorted(batch), f"the batch of record {i}"
    ((dst, step, msg, failed, err, began_t, began_b, last_t, last_b, finish_sent, ended),) = report
    assert (dst, step, msg, failed, err, finish_sent) == (3, 7, 2, 0, 0, 0)
    assert began_b == 0 and last_b >= began_b and last_t >= began_t and ended >= last_t


@pytest.mark.parametrize("threads", THREADS)
def test_paths_leave_from_their_own_sockets(threads: int) -> None:
    with _sockets(n_send=2) as (rx, txs):
        ports = [s.getsockname()[1] for s in txs]
        engine = _engine([s.fileno() for s in txs], 3, threads)
        try:
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            r = _round(count=12, stride=500, short_len=500)
            r["path"] = np.array([0, 0, 1, 1, 1, 0, 0, 0, 1, 0, 1, 1], np.uint8)
            _post(engine, dst=1, step=0, msg=0, order=1, **r)
            got = _receive(rx, 12)
        finally:
            engine.close()
    order = _record_index(r, got)
    assert sorted(order) == list(range(12))
    assert [port for _, port in got] == [ports[r["path"][i]] for i in order]


@pytest.mark.parametrize("threads", THREADS)
def test_a_paced_round_takes_its_time(threads: int) -> None:
    """1 MB at 20 MB/s with 64 KB bursts: no sooner than the pacer allows, with
    any number of threads (each charges the pacer when it claims a batch)."""
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()], 8, threads)
        try:
            pacer = _pacer(initial_rate=20e6, min_rate=1e6, burst_bytes=65536)
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], pacer)
            r = _round(count=1000, stride=1000, short_len=1000)
            ((*_, began_t, _b, last_t, last_b, _f, _e),) = _post(
                engine, dst=1, step=0, msg=0, order=1, **r
            )
            _receive(rx, 1000)
        finally:
            engine.close()
    # the last batch leaves once the bytes before it were paid for at the rate
    assert last_t - began_t >= (last_b - 65536) / 20e6 * 0.95
    assert last_b >= 1_000_000 - 65536


@pytest.mark.parametrize("threads", THREADS)
def test_a_round_of_one_batch_goes_from_post_itself(threads: int) -> None:
    """Rule 7: a round of one batch that the pacer lets go goes from post(),
    which returns its report; the engine's threads, and its eventfd, have nothing
    to do with it. A longer round is the threads'."""
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()], batch_packets=20, threads=threads)
        try:
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            ended = engine.post(dst=1, step=3, msg=4, order=1, **_round(15, 1000, 10))
            assert ended is not None and ended[:5] == (1, 3, 4, 0, 0)
            assert len(_receive(rx, 15)) == 15
            ready, _, _ = select.select([engine.fileno()], [], [], 0.1)
            assert not ready and engine.reap() == []
            # 30 records in batches of 20: the engine's thread sends them
            longer = _round(30, 1000, 10, seed=5)
            assert engine.post(dst=1, step=3, msg=5, order=2, **longer) is None
            assert len(_wait_report(engine)) == 1 and len(_receive(rx, 30)) == 30
        finally:
            engine.close()


def test_the_earliest_message_of_each_step_goes_first_by_class() -> None:
    """Rule 1 of the engine: of two steps, the higher class at its cursor goes
    first; a later message of the same step waits for the earlier one."""
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()], batch_packets=1)
        try:
            pacer = _pacer(initial_rate=1e6, min_rate=1e3, burst_bytes=100, max_lateness=0.0)
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], pacer)
            # 0.3 s of debt (the engine's clock is time.monotonic()): all three rounds
            # are queued before any goes
            pacer.on_sent(300_000, now=time.monotonic())
            low = _round(count=2, stride=100, short_len=100, seed=1)
            high = _round(count=2, stride=100, short_len=100, seed=2)
            high["prio"][:] = 5
            later = _round(count=2, stride=100, short_len=100, seed=3)
            later["prio"][:] = 7  # a later message of step 1: waits for `low`, whatever its class
            engine.post(dst=1, step=1, msg=0, order=1, **low)
            engine.post(dst=1, step=2, msg=0, order=2, **high)
            engine.post(dst=1, step=1, msg=1, order=3, **later)
            got = [d for d, _ in _receive(rx, 6)]
        finally:
            engine.close()
    order = [bytes(r["records"][i]) for r in (high, low, later) for i in range(2)]
    assert got == order


@pytest.mark.parametrize("threads", THREADS)
def test_cancel_takes_a_round_back(threads: int) -> None:
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()], threads=threads)
        try:
            pacer = _pacer(initial_rate=1e5, min_rate=1e3, burst_bytes=1000)
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], pacer)
            # (1000 records at 100 KB/s: 10 s, in the engine's thread)
            assert engine.post(dst=1, step=0, msg=0, order=1, **_round(1000, 1000, 1000)) is None
            assert engine.cancel(1, 0, 0) is True
            assert engine.cancel(1, 0, 0) is False  # (nothing left to take back)
            assert engine.cancel(9, 0, 0) is False
            ready, _, _ = select.select([engine.fileno()], [], [], 0.2)
            assert not ready and engine.reap() == []  # a cancelled round is not reported
        finally:
            engine.close()


@pytest.mark.parametrize("threads", [2, 4])
def test_cancel_waits_for_the_batches_on_their_way(threads: int) -> None:
    """Rule 6 with several batches of a round on their way at once: when cancel()
    returns, every datagram of the round the engine will ever send is in the
    receiver's socket (loopback delivers within the send call), so the lent
    payload, overwritten then, shows in none of them; a round of the same step
    posted after it goes (it no longer holds the step)."""
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()], batch_packets=4, threads=threads)
        try:
            pacer = _pacer(initial_rate=50e6, min_rate=1e6, burst_bytes=64 * 1032)
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], pacer)
            r = _lent_round(count=4000, head=32, chunk=1000, tail=1000, seed=4)
            assert engine.post(dst=1, step=0, msg=0, order=1, **r) is None
            rx.settimeout(10.0)
            first = rx.recv(65536)  # (the round is under way)
            assert engine.cancel(1, 0, 0) is True
            r["payload"][:] = 7
            marker = _round(1, 200, 200, seed=9)
            ended = engine.post(dst=1, step=0, msg=1, order=2, **marker)
            before = [first]
            while (d := rx.recv(65536)) != marker["records"][0].tobytes():
                before.append(d)
            if ended is None:
                _wait_report(engine)
            sent = engine.stats()["engine_datagrams"]
        finally:
            engine.close()
    assert len(before) == sent - 1 < 4000  # (all but the marker; cut short)
    assert not any(d[32:] == bytes([7]) * 1000 for d in before)


@pytest.mark.parametrize("threads", THREADS)
def test_a_failed_send_reports_the_round_failed(threads: int) -> None:
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()], threads=threads)
        try:
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            # more than a UDP datagram holds (65,507 bytes over IPv4): EMSGSIZE
            ((dst, step, msg, failed, err, *_),) = _post(
                engine, dst=1, step=4, msg=5, order=1, **_round(2, 65535, 65535)
            )
        finally:
            engine.close()
    assert (dst, step, msg, failed, err) == (1, 4, 5, 1, errno.EMSGSIZE)


@pytest.mark.parametrize("threads", THREADS)
def test_a_round_whose_batches_fail_side_by_side_is_reported_failed_once(threads: int) -> None:
    """40 batches of one record each, every one refused (EMSGSIZE), several on
    their way at once with more threads: one report, failed; a later message of
    the same step, which waits until no batch of the first is on its way, is
    reported after it, sent, and nothing else is."""
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()], batch_packets=1, threads=threads)
        try:
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            assert engine.post(dst=1, step=4, msg=5, order=1, **_round(40, 65535, 65535)) is None
            assert engine.post(dst=1, step=4, msg=6, order=2, **_round(3, 1000, 10)) is None
            reports: list[Any] = []
            while not any(r[2] == 6 for r in reports):
                reports += _wait_report(engine)
            _receive(rx, 3)
        finally:
            engine.close()
    assert [r[:5] for r in reports] == [(1, 4, 5, 1, errno.EMSGSIZE), (1, 4, 6, 0, 0)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"count": 0}, "bad geometry"),
        ({"stride": 70000}, "bad geometry"),
        ({"per_message": 100}, "bad geometry"),
        ({"short": 50}, "bad geometry"),
        ({"tos": np.zeros(3, np.uint8)}, "tos has 3 bytes"),
        ({"breaks": np.zeros(3, np.uint8)}, "int64"),
        ({"breaks": np.array([5, 5, 10], np.int64)}, "breaks must increase"),
        ({"breaks": np.array([5, 11], np.int64)}, "breaks must increase"),
        ({"breaks": np.array([5], np.int64)}, "end at the count"),
        ({"short": 3, "short_len": 10}, "follow the short record"),
        ({"per_message": 65}, "bad geometry"),
    ],
)
def test_a_bad_post_is_refused_by_name(change: dict[str, Any], message: str) -> None:
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()])
        try:
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            with pytest.raises(ValueError, match=message):
                engine.post(dst=1, step=0, msg=0, order=1, **{**_round(10, 1000, 1000), **change})
            with pytest.raises(ValueError, match="rank 2 has no peer"):
                engine.post(dst=2, step=0, msg=0, order=1, **_round(10, 1000, 1000))
            with pytest.raises(ValueError, match="not an IPv4 address"):
                engine.add_peer(2, "localhost", 5, _pacer(unpaced=True))
        finally:
            engine.close()


def test_an_engine_holds_one_reference_to_each_peers_pacer() -> None:
    """add_peer keeps one reference to the pacer it attaches (none more when the same
    pacer is attached again), drops the one of a pacer it replaces, which can then
    pace for another engine, and close drops the rest."""
    with _sockets() as (rx, (tx,)):
        port = rx.getsockname()[1]
        first, second = _engine([tx.fileno()]), _engine([tx.fileno()])
        old, new = _pacer(unpaced=True), _pacer(unpaced=True)
        old_refs, new_refs = sys.getrefcount(old), sys.getrefcount(new)
        try:
            first.add_peer(1, "127.0.0.1", port, old)
            first.add_peer(1, "127.0.0.1", port, old)
            assert sys.getrefcount(old) == old_refs + 1
            with pytest.raises(ValueError, match="belongs to another engine"):
                second.add_peer(1, "127.0.0.1", port, old)
            first.add_peer(1, "127.0.0.1", port, new)
            assert (sys.getrefcount(old), sys.getrefcount(new)) == (old_refs, new_refs + 1)
            second.add_peer(4, "127.0.0.1", port, old)  # (set free by the replacement)
            assert sys.getrefcount(old) == old_refs + 1
        finally:
            first.close()
            second.close()
        assert (sys.getrefcount(old), sys.getrefcount(new)) == (old_refs, new_refs)


def _thread_names() -> list[str]:
    """The kernel's names of this process's threads (a thread that exits between
    the listing and the read is left out: it no longer runs)."""
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{t}/comm").read_text().strip())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return sorted(names)


def test_each_send_thread_is_named_and_stopped_by_close() -> None:
    native = load("_engine")  # (make sanitize: the build it names)

    with _sockets() as (_, (tx,)):
        engine = native.Engine([tx.fileno()], 8, "dlcp-send-7", threads=3)
        try:
            ours = [n for n in _thread_names() if n.startswith("dlcp-send-7")]
            assert ours == ["dlcp-send-7", "dlcp-send-7.1", "dlcp-send-7.2"]
        finally:
            engine.close()
        # close() joined them; the kernel lists a joined thread until it has finished
        # exiting (pthread_join returns at the exit's tid wake-up, before the task is
        # reaped), which on a busy machine can take a few scheduling rounds
        deadline = time.monotonic() + 10.0
        while (left := [n for n in _thread_names() if n.startswith("dlcp-send-7")]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.01)
        assert not left


@pytest.mark.parametrize("threads", [0, 33, -1])
def test_a_bad_thread_count_is_refused_by_name(threads: int) -> None:
    with _sockets() as (_, (tx,)), pytest.raises(ValueError, match=f"threads={threads} outside"):
        _engine([tx.fileno()], threads=threads)


def _lent_round(count: int, head: int, chunk: int, tail: int, seed: int = 0) -> dict[str, Any]:
    """A round whose records are ``head``-byte headers and whose payload is lent:
    datagram ``i`` is header ``i`` then chunk ``seqs[i]`` of the payload (the
    message's last chunk ``tail`` bytes, sent last), in a shuffled send order."""
    rng = np.random.default_rng(seed)
    payload = rng.integers(0, 256, (count - 1) * chunk + tail, dtype=np.uint8)
    seqs = np.concatenate((rng.permutation(count - 1), [count - 1])).astype(np.int64)
    r = _round(count, head + chunk, head + tail if tail < chunk else head + chunk, seed)
    r["records"] = rng.integers(0, 256, (count, head), dtype=np.uint8)
    return {**r, "payload": payload, "seqs": seqs, "chunk_bytes": chunk}


def _expected(r: dict[str, Any], i: int) -> bytes:
    chunk = r["chunk_bytes"]
    seq = int(r["seqs"][i])
    return r["records"][i].tobytes() + r["payload"][seq * chunk : (seq + 1) * chunk].tobytes()


@pytest.mark.parametrize(("per_message", "batch_packets"), [(1, 352), (8, 5), (44, 7)])
@pytest.mark.parametrize("tail", [1000, 123])
def test_a_lent_round_gathers_each_datagram_from_its_header_and_the_payload(
    per_message: int, batch_packets: int, tail: int
) -> None:
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()], batch_packets)
        try:
            engine.add_peer(3, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            r = _lent_round(count=50, head=32, chunk=1000, tail=tail)
            report = _post(engine, dst=3, step=7, msg=2, order=1,
                           **{**r, "per_message": per_message})  # fmt: skip
            got = _receive(rx, 50)
        finally:
            engine.close()
    assert [len(d) for d, _ in got] == [1032] * 49 + [32 + tail]
    for i, (data, _) in enumerate(got):
        assert data == _expected(r, i), f"datagram {i} (chunk {r['seqs'][i]})"
    assert report[0][3:5] == (0, 0)


def test_a_lent_round_reads_the_payload_when_it_sends() -> None:
    # the engine holds the payload, not a copy: what the lender's memory holds
    # when a batch goes is what goes (hence the lender's promise: no writes
    # where the receiver may still need the bytes)
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()])
        try:
            pacer = _pacer(initial_rate=1e6, min_rate=1e3, burst_bytes=100_000)
            engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], pacer)
            pacer.on_sent(2_000_000, now=time.monotonic())  # 2 s of debt: nothing goes yet
            r = _lent_round(count=6, head=32, chunk=1000, tail=1000)
            assert engine.post(dst=1, step=0, msg=0, order=1, **r) is None
            r["payload"][:] = 7
            got = _receive(rx, 6)
            _wait_report(engine)
        finally:
            engine.close()
    assert all(d[32:] == bytes([7]) * 1000 for d, _ in got)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"seqs": np.array([0, 1, 2, 9], np.int64)}, "record 3's chunk 9 .* lies outside"),
        ({"seqs": np.array([0, 1, 2, -1], np.int64)}, "record 3's chunk -1"),
        ({"seqs": np.arange(4, dtype=np.int32)}, "seqs must be 4 int64"),
        ({"seqs": np.arange(3, dtype=np.int64)}, "seqs must be 4 int64"),
        ({"chunk_bytes": 1032}, "1 <= chunk_bytes < stride"),
        ({"chunk_bytes": 0}, "1 <= chunk_bytes < stride"),
        ({"payload": np.zeros(3999, np.uint8)}, "record 3's chunk 3 .* outside the 3999-byte"),
        ({"records": np.zeros((4, 1032), np.uint8)}, "records has 4128 bytes, expected 4 of 32"),
    ],
)
def test_a_lent_round_that_reaches_outside_its_payload_is_refused(
    change: dict[str, Any], words: str
) -> None:
    with _sockets() as (rx, (tx,)):
        engine = _engine([tx.fileno()])
        try:
            engine.add_peer(0, "127.0.0.1", rx.getsockname()[1], _pacer(unpaced=True))
            r = _lent_round(count=4, head=32, chunk=1000, tail=1000)
            r["seqs"] = np.arange(4, dtype=np.int64)
            with pytest.raises(ValueError, match=words):
                engine.post(dst=0, step=0, msg=0, order=1, **{**r, **change})
            assert engine.stats()["engine_datagrams"] == 0
        finally:
            engine.close()
