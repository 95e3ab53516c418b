"""The endpoint's UDP receive loop: the C version (dlcp.io._udpio) and the Python
one hand over the same runs of datagrams, on a real socket over loopback."""

from __future__ import annotations

import itertools
import socket

import numpy as np
import pytest

from dlcp.io import udp
from dlcp.io.udp import DataSockets

IMPLS = [
    False,
    pytest.param(
        True, marks=pytest.mark.skipif(udp._udpio is None, reason="dlcp.io._udpio not built")
    ),
]

#: datagram sizes: runs of equal size, short ones that end a run, an empty one
SIZES = [1472] * 5 + [100] + [1472] * 3 + [800] * 4 + [0] + [1472] * 2 + [64] * 3


def _receive_all(accelerated: bool, sizes: list[int]) -> list[tuple[bytes, int]]:
    rx = DataSockets("127.0.0.1", 0, 1, gso="auto", gro="auto", rcvbuf=1 << 22, sndbuf=1 << 20)
    got: list[tuple[bytes, int]] = []
    try:
        rng = np.random.default_rng(len(sizes))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for n in sizes:
                tx.sendto(rng.integers(0, 256, n, dtype=np.uint8).tobytes(), rx.address)
        # every datagram is queued on loopback once sendto returned
        total = rx.receive(
            lambda buf, seg: got.append((buf.tobytes(), seg)), accelerated=accelerated
        )
        assert total == sum(sizes)
        assert rx.empty_datagrams == sizes.count(0)
    finally:
        rx.close()
    return got


@pytest.mark.parametrize("accelerated", IMPLS)
def test_runs_of_same_size_datagrams_end_where_the_size_changes(accelerated: bool) -> None:
    got = _receive_all(accelerated, SIZES)
    rng = np.random.default_rng(len(SIZES))
    sent = b"".join(rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in SIZES)
    assert b"".join(data for data, _ in got) == sent
    # one datagram per read on loopback: each size change starts a run
    assert [(len(data), seg) for data, seg in got] == [
        (1472 * 5, 1472),
        (100, 100),
        (1472 * 3, 1472),
        (800 * 4, 800),
        (1472 * 2, 1472),
        (64 * 3, 64),
    ]


def test_c_and_python_loops_deliver_the_same_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    if udp._udpio is None:
        pytest.skip("dlcp.io._udpio not built")
    # (in one step: the C loop's recvmmsg batches may end a step a few reads
    # later than the Python loop's single reads; see the test below)
    monkeypatch.setattr(udp, "RECEIVE_STEP_BYTES", udp.RECEIVE_BUFFER_BYTES)
    sizes = [int(x) for x in np.random.default_rng(5).choice([0, 33, 700, 1472, 9000], 300)]
    assert _receive_all(True, sizes) == _receive_all(False, sizes)


@pytest.mark.parametrize("accelerated", IMPLS)
def test_steps_bound_the_runs_and_lose_nothing(accelerated: bool) -> None:
    # 400 datagrams of 1,472 bytes (589 KB) arrive before the call: each step
    # reads about RECEIVE_STEP_BYTES (256 KB) and hands its runs over before the next
    # reads over them from the start of the buffer
    sizes = [1472] * 400
    got = _receive_all(accelerated, sizes)
    rng = np.random.default_rng(len(sizes))
    sent = b"".join(rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes)
    assert b"".join(data for data, _ in got) == sent
    assert all(seg == 1472 and len(data) % 1472 == 0 for data, seg in got)
    # a step ends after the read that reaches RECEIVE_STEP_BYTES (a batch of reads in C)
    assert len(got) >= 3
    assert all(len(data) <= udp.RECEIVE_STEP_BYTES + 64 * 1472 for data, _ in got)


def test_buffer_refills_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    if udp._udpio is None:
        pytest.skip("dlcp.io._udpio not built")
    # a receive buffer of three reads: the C loop stops, its runs are delivered,
    # and it goes on from the start of the buffer, as the Python loop does
    monkeypatch.setattr(udp, "RECEIVE_BUFFER_BYTES", 3 * 65536)
    sizes = [1472] * 200
    c, py = _receive_all(True, sizes), _receive_all(False, sizes)
    assert c == py
    assert len(c) > 1 and b"".join(d for d, _ in c) == b"".join(d for d, _ in py)


@pytest.mark.parametrize("gso", ["off", "auto", "auto-python"])
def test_a_batch_sent_without_and_with_gso_arrives_whole(
    gso: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gso=off: one sendmmsg per up to 256 datagrams (C) or a sendmsg each (Python);
    # gso=auto: every 64 KB GSO message in one sendmmsg (C) or a sendmsg each (Python)
    if gso == "auto-python":
        monkeypatch.setattr(udp, "_udpio", None)
        gso = "auto"
    rx = DataSockets("127.0.0.1", 0, 1, gso="auto", gro="off", rcvbuf=1 << 22, sndbuf=1 << 20)
    tx = DataSockets("127.0.0.1", 0, 1, gso=gso, gro="off", rcvbuf=1 << 20, sndbuf=1 << 22)
    try:
        data = np.random.default_rng(9).integers(0, 256, 300 * 1000 + 123, dtype=np.uint8)
        assert tx.send(data.data, 1000, 301, path=0, tos=0x2A, addr=rx.address) == 301
        got: list[tuple[bytes, int]] = []
        rx.receive(lambda buf, seg: got.append((buf.tobytes(), seg)))
        assert b"".join(d for d, _ in got) == data.tobytes()
        # (runs of 1,000-byte datagrams, split where a receive step ended, then the short one)
        assert [seg for seg, _ in itertools.groupby(seg for _, seg in got)] == [1000, 123]
    finally:
        tx.close()
        rx.close()


def test_plain_and_coalesced_reads_mixed_give_the_same_runs_in_c_and_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # plain datagrams (the C loop then reads up to 64 per recvmmsg), GSO batches
    # that arrive GRO-coalesced (back to one recvmsg per read), plain ones again
    if udp._udpio is None:
        pytest.skip("dlcp.io._udpio not built")
    monkeypatch.setattr(udp, "RECEIVE_STEP_BYTES", udp.RECEIVE_BUFFER_BYTES)  # (in one step)
    groups = [("plain", 150, 1472), ("gso", 200, 1000), ("plain", 3, 1000), ("plain", 40, 1472),
              ("gso", 90, 1472), ("plain", 1, 77)]  # fmt: skip
    rng = np.random.default_rng(11)
    payloads = [rng.integers(0, 256, count * size, dtype=np.uint8) for _, count, size in groups]

    def receive(accelerated: bool) -> list[tuple[bytes, int]]:
        rx = DataSockets("127.0.0.1", 0, 1, gso="auto", gro="auto", rcvbuf=1 << 23, sndbuf=1 << 20)
        tx = DataSockets("127.0.0.1", 0, 1, gso="auto", gro="off", rcvbuf=1 << 20, sndbuf=1 << 22)
        got: list[tuple[bytes, int]] = []
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as plain:
                for (how, count, size), data in zip(groups, payloads, strict=True):
                    if how == "gso":
                        sent = tx.send(data.data, size, count, path=0, tos=0, addr=rx.address)
                        assert sent == count
                    else:
                        for k in range(count):
                            plain.sendto(data[k * size : (k + 1) * size].tobytes(), rx.address)
            rx.receive(lambda buf, seg: got.append((buf.tobytes(), seg)), accelerated=accelerated)
        finally:
            tx.close()
            rx.close()
        return got

    c, py = receive(True), receive(False)
    assert c == py
    assert b"".join(d for d, _ in c) == b"".join(p.tobytes() for p in payloads)


@pytest.mark.parametrize("accelerated", IMPLS)
def test_a_receive_that_stops_at_its_budget_reports_the_backlog(accelerated: bool) -> None:
    rx = DataSockets("127.0.0.1", 0, 1, gso="auto", gro="auto", rcvbuf=1 << 22, sndbuf=1 << 20)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for _ in range(10):
                tx.sendto(bytes(1000), rx.address)
        got: list[int] = []

        def deliver(buf: np.ndarray, seg: int) -> None:
            got.append(len(buf))

        assert rx.receive(deliver, budget=4000, accelerated=accelerated) >= 4000
        assert rx.backlog  # stopped at the budget, datagrams still queued
        rx.receive(deliver, accelerated=accelerated)
        assert not rx.backlog  # ran dry
        assert sum(got) == 10_000
        rx.receive(deliver, accelerated=accelerated)
        assert not rx.backlog and sum(got) == 10_000
    finally:
        rx.close()


@pytest.mark.parametrize(("gso", "gro"), [("off", "off"), ("auto", "auto")])
def test_gso_and_gro_detection_is_logged(
    caplog: pytest.LogCaptureFixture, gso: str, gro: str
) -> None:
    with caplog.at_level("INFO", logger="dlcp.io"):
        rx = DataSockets("127.0.0.1", 0, 2, gso=gso, gro=gro, rcvbuf=1 << 20, sndbuf=1 << 20)
        rx.close()
    (line,) = [r.getMessage() for r in caplog.records if "data socket" in r.getMessage()]
    assert "2 path(s)" in line
    assert f"GSO {'on' if rx.use_gso else 'off'}" in line
    assert f"GRO {'on' if rx.use_gro else 'off'}" in line
    if gso == "off":
        assert "GSO off, GRO off" in line


def test_c_send_batch_refuses_a_message_count_that_overflows_the_size_check() -> None:
    # per_message * seg overflowed, passed the 64 KB check and left a zero step to
    # divide by (SIGFPE); udp.py never passes more than 64, only a direct call can
    if udp._udpio is None:
        pytest.skip("dlcp.io._udpio not built")
    with pytest.raises(ValueError, match="does not fit one UDP GSO message"):
        udp._udpio.send_batch(-1, b"x" * 100, 4, 1 << 62, "127.0.0.1", 9, 0)


@pytest.mark.parametrize("accelerated", [True, False])
@pytest.mark.parametrize("tail", [700, 123])
def test_gathered_datagrams_are_each_header_then_its_chunk(
    accelerated: bool, tail: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlcp.io import udp

    if accelerated and udp._udpio is None:
        pytest.skip("the C extension was not built")
    if not accelerated:
        monkeypatch.setattr(udp, "_udpio", None)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5.0)
    sockets = udp.DataSockets(
        "127.0.0.1", 0, 1, gso="off", gro="off", rcvbuf=1 << 20, sndbuf=1 << 20
    )
    try:
        rng = np.random.default_rng(3)
        heads = rng.integers(0, 256, (5, 32), dtype=np.uint8)
        payload = rng.integers(0, 256, 4 * 700 + tail, dtype=np.uint8)
        sent = sockets.send_gathered(heads, payload, 700, path=0, tos=0, addr=rx.getsockname())
        got = [rx.recv(65536) for _ in range(5)]
    finally:
        sockets.close()
        rx.close()
    assert sent == 5
    assert got == [
        bytes(heads[i]) + bytes(payload[i * 700 : (i + 1) * 700]) for i in range(5)
    ]
