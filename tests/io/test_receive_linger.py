"""The native receive loop's linger (``dlcp/io/_linger.h``): after the data socket
ran dry it waits in C for the next burst instead of returning to Python, until
the linger ends, another file of the I/O thread's epoll set turns readable, or
a run needs Python (here: the message may be complete). Then the endpoints:
they linger on the native engine only, and deliver exactly with the longest
linger; and the setting is checked."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest

from dlcp.errors import ConfigError
from dlcp.io import native_receive
from dlcp.io.config import EndpointConfig
from dlcp.io.engine import native_available
from dlcp.io.udp import _GSO_MAX_SEGMENTS, DataSockets
from dlcp.proto.receive_paths import Taken
from tests.io.test_native_receive import MSG, NOW, STEP, message, registered
from tests.proto.session_helpers import received_events

pytestmark = pytest.mark.skipif(
    not native_receive.available(), reason="the native receive path was not built"
)

N = 20_000  # ~57 datagrams at MTU 1500
#: a linger no test waits out: each call below must end for another reason
LONG = 30.0
#: how long a test waits for the receiving thread to say it has taken something
WAIT = 20.0


class Receiver:
    """A registered message, the first datagram opened by Python, read from a
    loopback socket by the whole receive loop in a thread of its own."""

    def __init__(self, seed: int) -> None:
        self.grams, _ = message(N, seed=seed)
        self.seed = seed
        self.runs, self.session, self.out = registered(N)
        seg = len(self.grams[0])
        self.session.receive_batch(np.frombuffer(self.grams[0], np.uint8), seg, now=NOW)
        self.reassembler = self.session._inbox._incoming[(0, STEP, MSG)].reassembler
        # (GRO: a GSO burst is one read, as a sender's batch is on the loopback)
        self.socks = DataSockets(
            "127.0.0.1", 0, 1, gso="off", gro="on", rcvbuf=8 << 20, sndbuf=1 << 20
        )
        self.socks.runs = self.runs
        self.tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.burst_tx = DataSockets(
            "127.0.0.1", 0, 1, gso="on", gro="off", rcvbuf=1 << 20, sndbuf=8 << 20
        )
        self.calls = 0
        self.datagrams = 0  # taken by the table
        self.error: BaseException | None = None

    def taken(self, taken: list[Taken]) -> None:
        self.datagrams += sum(t[3] for t in taken)
        self.session.receive_taken(taken, now=NOW)

    def rest(self, buf: npt.NDArray[np.uint8], segment_size: int) -> None:
        self.session.receive_rest(buf, segment_size, now=NOW)

    def send(self, grams: list[bytes]) -> None:
        """One datagram a system call: they may arrive one by one."""
        for g in grams:
            self.tx.sendto(g, self.socks.address)

    def send_burst(self, grams: list[bytes]) -> None:
        """One GSO message (at most 64 KB): it arrives whole, as one read."""
        raw = b"".join(grams)
        assert len(raw) < 1 << 16 and all(len(g) == len(grams[0]) for g in grams[:-1])
        sent = self.burst_tx.send(
            memoryview(raw), len(grams[0]), len(grams), path=0, tos=0, addr=self.socks.address
        )
        assert sent == len(grams)

    def receive(
        self, linger: float, watch: int = -1, nap: float = 0.0, trickle: float = 0.0
    ) -> threading.Thread:
        """One receive call, in a thread (started)."""

        def deliver(b: npt.NDArray[np.uint8], seg: int) -> None:
            self.session.receive_batch(b, seg, now=NOW)

        def run() -> None:
            try:
                self.calls += 1
                self.socks.receive(
                    deliver, taken=self, linger=linger, watch=watch, nap=nap, trickle=trickle
                )
            except BaseException as exc:  # (re-raised by the test)
                self.error = exc

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def wait_until_taken(self, chunks: int, thread: threading.Thread) -> None:
        """Until the receive call has written ``chunks`` chunks' places in the
        message's chunk map (the C loop writes it as it takes them)."""
        deadline = time.monotonic() + WAIT
        while int(self.reassembler.received.sum()) < chunks:
            assert thread.is_alive(), f"the receive call ended first ({self.error!r})"
            assert time.monotonic() < deadline, "the receive call took nothing"
            time.sleep(0.001)

    def close(self) -> None:
        self.tx.close()
        self.burst_tx.close()
        self.socks.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(seed=21)
    try:
        yield r
    finally:
        r.close()


class Watched:
    """An epoll set like the I/O thread's, with a socket pair standing for another
    of its files (a control connection, a caller's wake-up), and the data socket
    too if asked."""

    def __init__(self, r: Receiver, *, with_data: bool) -> None:
        self.wake_r, self.wake_w = socket.socketpair()
        self.epoll = select.epoll()
        if with_data:
            self.epoll.register(r.socks.recv_sock.fileno(), select.EPOLLIN)
        self.epoll.register(self.wake_r.fileno(), select.EPOLLIN)

    def fileno(self) -> int:
        return self.epoll.fileno()

    def wake(self) -> None:
        self.wake_w.send(b"\0")

    def close(self) -> None:
        self.epoll.close()
        self.wake_r.close()
        self.wake_w.close()


def _joined(thread: threading.Thread, r: Receiver) -> None:
    thread.join(WAIT)
    assert not thread.is_alive(), "the receive call is still lingering"
    if r.error is not None:
        raise r.error


def test_data_that_comes_while_the_loop_lingers_is_taken_in_the_same_call(
    receiver: Receiver,
) -> None:
    """The first part arrives, the call takes it and lingers; the rest arrives in
    one burst while it lingers and is taken by the same call, which ends when the
    message may be complete (a run that needs Python), long before its linger.
    The burst is one GSO send (at most 64 datagrams): one read. A burst of several
    sends can be read in pieces on a busy machine, and a piece smaller than
    LINGER_MIN_BURST ends the lingering (_linger.h) before the next one comes."""
    r = receiver
    half = len(r.grams) - _GSO_MAX_SEGMENTS
    assert half > 1
    r.send(r.grams[1:half])
    thread = r.receive(LONG)
    r.wait_until_taken(half, thread)  # (chunk 0 was Python's)
    assert thread.is_alive()
    r.send_burst(r.grams[half:])
    _joined(thread, r)
    assert r.calls == 1 and r.datagrams == len(r.grams) - 1
    assert 0.0 < r.socks.lingered < LONG
    (got,) = received_events(r.session)
    want = np.random.default_rng(r.seed).standard_normal(N).astype(np.float32)
    assert got.report.lost_elems == 0 and r.out.tobytes() == want.tobytes()


def test_a_trickle_after_a_wait_ends_the_lingering(receiver: Receiver) -> None:
    """A wait after which less than LINGER_MIN_BURST bytes come (here one
    datagram) ends the call: data that trickles in is left to queue up while the
    thread runs its Python turn, instead of waking it for each datagram."""
    r = receiver
    r.send(r.grams[1:10])
    thread = r.receive(LONG)
    r.wait_until_taken(10, thread)
    r.send(r.grams[10:11])
    _joined(thread, r)
    assert r.calls == 1 and r.datagrams == 10 and r.socks.lingered < LONG
    assert received_events(r.session) == []


@pytest.mark.parametrize("data_in_watch", [False, True])
def test_with_naps_a_trickle_is_taken_in_the_same_call(
    receiver: Receiver, data_in_watch: bool
) -> None:
    """With a nap, data that trickles in after a wait (here a datagram at a time)
    does not end the call: it sleeps a nap at a time and takes what came, until
    another watched file turns readable (here a socket pair standing for a caller's
    wake-up), long before its trickle's end. The watched set is the I/O thread's
    set of its other files; one that holds the data socket too (as the whole set
    does) works as well: the nap then sleeps on when data wakes it."""
    r = receiver
    watched = Watched(r, with_data=data_in_watch)
    try:
        r.send(r.grams[1:10])
        thread = r.receive(LONG, watch=watched.fileno(), nap=0.002, trickle=LONG)
        r.wait_until_taken(10, thread)
        for k in range(10, 14):  # (each less than LINGER_MIN_BURST: a trickle)
            r.send(r.grams[k : k + 1])
            r.wait_until_taken(k + 1, thread)
        assert thread.is_alive()
        watched.wake()
        _joined(thread, r)
    finally:
        watched.close()
    assert r.calls == 1 and r.datagrams == 13 and 0.0 < r.socks.lingered < LONG
    assert received_events(r.session) == []


def test_naps_end_at_the_trickles_end(receiver: Receiver) -> None:
    """With nothing else ready, a call taking a trickle in naps returns at its
    trickle's end, later than its linger's, with what came. (The linger, a
    second, only has to outlast the test's sending of one datagram.)"""
    r = receiver
    r.send(r.grams[1:10])
    linger, trickle = 1.0, 1.5
    start = time.monotonic()
    thread = r.receive(linger, nap=0.01, trickle=trickle)
    r.wait_until_taken(10, thread)
    r.send(r.grams[10:11])
    r.wait_until_taken(11, thread)
    _joined(thread, r)
    assert time.monotonic() - start >= trickle
    assert r.calls == 1 and r.datagrams == 10
    assert trickle / 2 <= r.socks.lingered <= time.monotonic() - start


def test_another_ready_file_ends_the_linger(receiver: Receiver) -> None:
    """A file of the watched epoll set other than the data socket (here a socket
    pair standing for a control connection, the data socket watched too, as the
    I/O thread's set holds it) ends the linger: the call returns with what it
    took, the message incomplete."""
    r = receiver
    watched = Watched(r, with_data=True)
    try:
        r.send(r.grams[1:10])
        thread = r.receive(LONG, watch=watched.fileno())
        r.wait_until_taken(10, thread)
        watched.wake()
        _joined(thread, r)
    finally:
        watched.close()
    assert r.datagrams == 9 and r.socks.lingered < LONG
    assert received_events(r.session) == []


def test_with_nothing_coming_the_call_returns_after_its_linger(receiver: Receiver) -> None:
    r = receiver
    r.send(r.grams[1:10])
    linger = 0.05
    start = time.monotonic()
    r.socks.receive(lambda b, seg: None, taken=r, linger=linger)
    assert time.monotonic() - start >= linger
    assert r.datagrams == 9
    assert linger / 2 <= r.socks.lingered <= time.monotonic() - start


def test_without_a_linger_the_call_returns_once_the_socket_runs_dry(receiver: Receiver) -> None:
    r = receiver
    r.send(r.grams[1:10])
    r.socks.receive(lambda b, seg: None, taken=r)
    assert r.datagrams == 9 and r.socks.lingered == 0.0


def test_a_negative_linger_is_refused(receiver: Receiver) -> None:
    buf = np.zeros(1 << 16, np.uint8)
    fd = receiver.socks.recv_sock.fileno()
    with pytest.raises(ValueError, match="linger_ns, nap_ns and trickle_ns >= 0"):
        receiver.runs.table.receive(fd, buf, 1 << 16, 8, 2048, 1 << 16, None, -1, -1)
    with pytest.raises(ValueError, match="linger_ns, nap_ns and trickle_ns >= 0"):
        receiver.runs.table.receive(fd, buf, 1 << 16, 8, 2048, 1 << 16, None, 0, -1, -1)
    with pytest.raises(ValueError, match="linger_ns, nap_ns and trickle_ns >= 0"):
        receiver.runs.table.receive(fd, buf, 1 << 16, 8, 2048, 1 << 16, None, 0, -1, 0, -1)


# ------------------------------------------------------------------ endpoints


def test_a_bad_linger_is_named_as_typed() -> None:
    with pytest.raises(
        ConfigError, match=r"^DLCP_RECEIVE_LINGER=0\.5 outside \[0, 0\.01\] seconds$"
    ):
        EndpointConfig.from_env({"DLCP_RECEIVE_LINGER": "0.5"})
    with pytest.raises(ConfigError, match=r"^receive_linger=-1 outside"):
        EndpointConfig(receive_linger=-1)
    assert EndpointConfig.from_env({"DLCP_RECEIVE_LINGER": "0"}).receive_linger == 0.0


def test_a_bad_nap_is_named_as_typed() -> None:
    with pytest.raises(ConfigError, match=r"^DLCP_RECEIVE_NAP=0\.5 outside \[0, 0\.001\] seconds$"):
        EndpointConfig.from_env({"DLCP_RECEIVE_NAP": "0.5"})
    with pytest.raises(ConfigError, match=r"^receive_nap=-1 outside"):
        EndpointConfig(receive_nap=-1)
    assert EndpointConfig.from_env({"DLCP_RECEIVE_NAP": "0"}).receive_nap == 0.0


@pytest.mark.integration
@pytest.mark.skipif(not native_available(), reason="native engine not built")
@pytest.mark.parametrize("engines", [("native", "native"), ("native", "python")])
def test_endpoints_deliver_exactly_with_the_longest_linger(engines: tuple[str, str]) -> None:
    """Messages both ways at once, each side posting its next while the other's
    data arrives: with a 10 ms linger no transfer waits for it (a caller's post
    wakes a lingering loop; the engine's reports and control messages end it),
    and a Python-engine endpoint does not linger (it sends from its I/O thread)."""
    from tests.io.test_engines import _data, pair, transfer

    with pair(engines, receive_linger=0.01) as (a, b):
        assert [ep._linger for ep in (a, b)] == [
            0.01 if ep.engine == "native" and ep.native_receive else 0.0 for ep in (a, b)
        ]
        for msg in range(6):
            src, dst = (a, b) if msg % 2 == 0 else (b, a)
            data = _data(msg)
            received, _, out = transfer(src, dst, data, msg=msg, p=0.0)
            assert received.report.lost_elems == 0 and out.tobytes() == data.tobytes()
