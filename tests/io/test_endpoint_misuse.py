"""Caller mistakes and hostile peers that must fail one call, or nothing, and
never the endpoint's I/O thread (which every transfer with every peer needs).

Each case was found by a review and crashed the I/O thread, hung a future or
cut a live peer off before its fix (see each test)."""

from __future__ import annotations

import dataclasses
import datetime
import re
import socket
import threading
import time
from typing import Any

import numpy as np
import pytest

from dlcp.errors import ConfigError, PeerTimeout, TransferFailed
from dlcp.io import Endpoint, EndpointConfig
from dlcp.io.control import HELLO
from dlcp.proto.config import ProtocolConfig
from tests.io.endpoint_helpers import JOB, KEY, LocalStore, closed_endpoint, dlcp_threads

pytestmark = pytest.mark.integration

X = np.arange(1000, dtype=np.float32)


def _pair(**config: Any) -> tuple[Endpoint, Endpoint]:
    store = LocalStore()
    cfg = EndpointConfig(timeout=config.pop("timeout", 10.0), **config)
    key = KEY if cfg.protocol.authenticate else None  # (a key without authentication: refused)
    a, b = (Endpoint(r, store=store, world_size=2, job=JOB, config=cfg, key=key) for r in range(2))
    return a, b


def _exchange(a: Endpoint, b: Endpoint, msg: int) -> None:
    got = b.recv(src=0, msg=msg)
    a.send(X, to=1, msg=msg).result(timeout=10)
    assert np.array_equal(got.result(timeout=10).data, X)


def test_a_callback_that_cancels_a_sibling_while_a_peer_fails() -> None:
    """One receive failing (its peer went away) may cancel the others from its
    callback; fail_peer popped the sibling's entry after that and raised
    KeyError in the I/O thread."""
    store = LocalStore()
    cfg = EndpointConfig(timeout=10.0)
    a, b, c = (Endpoint(r, store=store, world_size=3, job=JOB, config=cfg) for r in range(3))
    try:
        _exchange(a, b, 0)  # a's control connection to b now carried a message
        first, second = b.recv(src=0, msg=1), b.recv(src=0, msg=2)
        first.add_done_callback(lambda _f: second.cancel())
        a.close()
        with pytest.raises(TransferFailed, match=closed_endpoint(0)):
            first.result(timeout=10)
        assert second.cancelled()
        # rank 1 still moves data with its other peer
        got = b.recv(src=2, msg=1)
        c.send(X, to=1, msg=1).result(timeout=10)
        assert np.array_equal(got.result(timeout=10).data, X)
        gone = b.stats()["peers_gone"]
        assert list(gone) == [0] and re.fullmatch(closed_endpoint(0), gone[0]), gone
    finally:
        for ep in (a, b, c):
            ep.close()
    assert dlcp_threads() == []


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ({"msg": 70_000}, r"msg=70000 does not fit its field \(0..65535\)"),
        ({"msg": -1}, r"msg=-1 does not fit"),
        ({"msg": 1, "step": 2**32}, r"step=4294967296 does not fit"),
        ({"msg": 1.5}, r"msg=1.5 must be an integer"),
    ],
)
def test_a_message_key_the_headers_cannot_carry_fails_that_call(
    key: dict[str, Any], message: str
) -> None:
    """recv() used to accept it and kill the I/O thread when its timeout had the
    session build an ABORT for it (that receive's future never settled)."""
    a, b = _pair(timeout=1.0)
    try:
        with pytest.raises(ValueError, match=message):
            b.recv(src=0, **key).result(timeout=5)
        with pytest.raises(ValueError, match=message):
            a.send(X, to=1, **key).result(timeout=5)
        _exchange(a, b, 3)  # both endpoints carry on
        assert a._thread.is_alive() and b._thread.is_alive()
    finally:
        a.close()
        b.close()


def test_a_read_only_out_is_refused_at_the_call() -> None:
    """Before, the first datagram's copy raised in the I/O thread."""
    a, b = _pair()
    try:
        out = np.empty_like(X)
        out.flags.writeable = False
        with pytest.raises(ValueError, match=r"out .* is read-only"):
            b.recv(src=0, msg=1, out=out)
        _exchange(a, b, 1)
    finally:
        a.close()
        b.close()


def test_peer_addresses_are_checked_and_host_names_resolved_once() -> None:
    """A host name reached the C send loop, which refused it with ValueError, and
    that killed the I/O thread (every peer's transfers failed)."""
    cfg = EndpointConfig(timeout=5.0)
    b = Endpoint(1, peers={0: ("127.0.0.1", 1, 1)}, config=cfg)
    try:
        a = Endpoint(0, peers={1: ("localhost", b.address.data_port, b.address.control_port)},
                     config=cfg)  # fmt: skip
        try:
            assert a._peers.addresses[1].host == "127.0.0.1"
            b._peers.addresses[0] = a.address
            _exchange(a, b, 1)
        finally:
            a.close()
        with pytest.raises(ConfigError, match=r"rank 1: cannot resolve host 'no-such-host"):
            Endpoint(0, peers={1: ("no-such-host.invalid", 9, 9)}, config=cfg)
        with pytest.raises(ConfigError, match=r"rank 1: peer address '0.0.0.0' is the wildcard"):
            Endpoint(0, peers={1: ("0.0.0.0", 9, 9)}, config=cfg)
        with pytest.raises(ConfigError, match=r"rank 1: peer data_port 0 is not a port"):
            Endpoint(0, peers={1: ("127.0.0.1", 0, 9)}, config=cfg)
    finally:
        b.close()
    assert dlcp_threads() == []


def test_this_ranks_own_address_and_ports_are_named_when_they_cannot_be_used() -> None:
    with pytest.raises(ConfigError, match=r"host='0.0.0.0': the address is published"):
        EndpointConfig(host="0.0.0.0")
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    try:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"cannot bind 127.0.0.1:{port} .*DLCP_DATA_PORT"):
            Endpoint(0, peers={1: ("127.0.0.1", 9, 9)}, config=EndpointConfig(data_port=port))
    finally:
        taken.close()
    assert dlcp_threads() == []


def test_the_rendezvous_store_view_waits_for_an_address_the_endpoints_timeout() -> None:
    """Its store view had no wait(), so a missing peer blocked for the store's
    own timeout (torch's default process group store: 30 minutes)."""
    from torch.distributed import TCPStore

    from dlcp.launch import free_port
    from dlcp.rendezvous import _Prefixed

    store = TCPStore("127.0.0.1", free_port(), 1, is_master=True,
                     timeout=datetime.timedelta(seconds=60))  # fmt: skip
    ep = Endpoint(0, store=_Prefixed(store, "view/"), world_size=2, job=JOB,
                  config=EndpointConfig(timeout=1.0))  # fmt: skip
    try:
        done = threading.Event()
        errors: list[BaseException] = []

        def call() -> None:
            try:
                ep.recv(src=1, msg=0)
            except BaseException as exc:  # (checked below)
                errors.append(exc)
            done.set()

        threading.Thread(target=call, daemon=True).start()
        assert done.wait(timeout=15), "waited for the store's timeout, not the endpoint's"
        assert len(errors) == 1 and isinstance(errors[0], PeerTimeout), errors
        assert "did not publish its address" in str(errors[0])
        assert store.check([f"view/dlcp/{JOB}/addr/0"])  # published under the prefix
    finally:
        ep.close()


def test_a_stranger_replaying_a_peers_connection_is_refused_at_its_hello() -> None:
    """With authentication on, a hello proves the job's key with a tag over the
    hello, the rank it is for and a fresh nonce. Before, the hello proved nothing:
    a captured FINISH replayed behind a hello "as rank 0", then a hang-up, made
    rank 1 record the live rank 0 as gone and fail everything with it. Now a
    replay of rank 0's connection (its hello and first frame) is refused at its
    hello (nonce seen), at another rank too (the proof names rank 1), and so is
    a bare hello; nothing the stranger sends reaches the session."""
    store = LocalStore()
    cfg = EndpointConfig(timeout=10.0, protocol=ProtocolConfig(authenticate=True))
    a, b, c = (Endpoint(r, store=store, world_size=3, job=JOB, config=cfg, key=KEY)
               for r in range(3))  # fmt: skip
    # what rank 0 wrote first on its connection to rank 1: the hello and the frame
    # behind it (later frames go through the engine's lock, or from its threads)
    wire: list[bytes] = []
    real_send_all = a._control._send_all

    def spy(sock: socket.socket, data: bytes) -> None:
        if not wire and bytes(data[:4]) == b"DLCP":
            wire.append(bytes(data))
        real_send_all(sock, data)

    a._control._send_all = spy  # type: ignore[method-assign]
    try:
        _exchange(a, b, 1)
        stream = b"".join(wire)
        assert stream[:4] == b"DLCP" and len(stream) > HELLO.size + 32
        frame = stream[HELLO.size + 32 :]

        def settled(target: Endpoint) -> bool:
            """Every control frame the target took came from rank 0's real
            connection (which may still be delivering the exchange's last frames:
            counting from a snapshot raced with them)."""
            legit = a.stats()["control_out"] if target is b else 0
            deadline = time.monotonic() + 5
            while target.stats()["control_in"] != legit and time.monotonic() < deadline:
                time.sleep(0.01)  # polls a counter; not a readiness wait
            return target.stats()["control_in"] == legit

        for target, data in (
            (b, stream),  # the connection again: the nonce was seen
            (c, stream),  # at another rank: the proof is for rank 1
            (b, HELLO.pack(b"DLCP", JOB, 0) + frame),  # no proof at all
        ):
            assert settled(target)
            stranger = socket.create_connection(("127.0.0.1", target.address.control_port))
            stranger.settimeout(10)
            stranger.sendall(data)
            assert stranger.recv(1) == b""  # refused: the endpoint closed it
            stranger.close()
            assert settled(target)  # not one of the stranger's frames taken
        _exchange(a, b, 2)  # rank 0 is still a peer of rank 1
        assert b.stats()["peers_gone"] == {} and c.stats()["peers_gone"] == {}
    finally:
        for ep in (a, b, c):
            ep.close()


def test_cancelling_many_receives_while_sending_does_not_deadlock() -> None:
    """Every cancel wakes the I/O thread with a byte on a socket pair; a burst of
    cancels filled it, and the next wake, written under the endpoint's lock,
    blocked while the I/O thread waited for that lock to read it (a review's
    reproducer: 3 hangs in 3 runs). The wake is non-blocking now."""
    store = LocalStore()
    cfg = EndpointConfig(timeout=60.0)
    a, b = (Endpoint(r, store=store, world_size=2, job=JOB, config=cfg) for r in range(2))
    futs = [b.recv(src=0, msg=i % 60000, step=i // 60000 + 1) for i in range(10_000)]
    done = threading.Event()

    def cancel() -> None:
        for f in futs:
            f.cancel()
        done.set()

    def send() -> None:
        i = 0
        while not done.is_set():
            b.send(X, to=0, msg=i % 60000, step=1000 + i // 60000)
            i += 1

    threads = [threading.Thread(target=f, daemon=True) for f in (send, cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stuck = [t for t in threads if t.is_alive()]
    assert not stuck, "deadlocked: a wake blocked under the endpoint's lock"
    for ep in (a, b):
        ep.close()


def test_a_rank_outside_the_job_is_refused_at_once() -> None:
    """send(to=5) in a job of 2 waited the endpoint's whole timeout for rank 5 to
    publish an address, then blamed it for not doing so."""
    store = LocalStore()
    cfg = EndpointConfig(timeout=20.0)
    a = Endpoint(0, store=store, world_size=2, job=JOB, config=cfg)
    try:
        started = time.monotonic()
        for call in (lambda: a.send(X, to=5, msg=1), lambda: a.recv(src=-1, msg=1)):
            with pytest.raises(ValueError, match=r"no rank -?\d in this job \(0\.\.1\)"):
                call()
        assert time.monotonic() - started < 5
    finally:
        a.close()


def test_a_datagram_from_a_rank_that_never_published_does_not_stall_the_endpoint() -> None:
    """With store= and no world_size any rank may send. A forged data packet that
    claims rank 7 made the I/O thread answer rank 7 and wait on the store, with
    the endpoint's lock held, for an address rank 7 never published: every
    transfer stalled for the store's timeout (a review's reproducer: 10 s)."""
    store = LocalStore()
    cfg = EndpointConfig(timeout=20.0)
    # b sends on the Python engine: the spy below catches a datagram at its socket call
    a, b = (
        Endpoint(r, store=store, job=JOB, config=dataclasses.replace(cfg, engine=engine))
        for r, engine in ((0, cfg.engine), (1, "python"))
    )
    sent: list[bytes] = []
    real_send = b._data.send

    def spy(data: Any, segment_size: int, count: int, **kw: Any) -> int:
        sent.append(bytes(data[:segment_size]))
        return int(real_send(data, segment_size, count, **kw))

    b._data.send = spy  # type: ignore[method-assign]
    try:
        got = a.recv(src=1, msg=1)
        b.send(X, to=0, msg=1).result(10)
        got.result(10)
        forged = bytearray(sent[0])
        forged[26:28] = (7).to_bytes(2, "big")  # src: rank 7
        forged[8:10] = (55).to_bytes(2, "big")  # msg 55
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.sendto(bytes(forged), ("127.0.0.1", a.address.data_port))
        started = time.monotonic()
        for m in range(2, 5):
            got = a.recv(src=1, msg=m)
            b.send(X, to=0, msg=m).result(10)
            assert np.array_equal(got.result(10).data, X)
        assert time.monotonic() - started < 5, "the endpoint stalled"
        # (its answer to rank 7, feedback or a NACK, goes out on a timer)
        deadline = time.monotonic() + 10
        while a.stats()["unroutable"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # polls a counter; not a readiness wait
        stats = a.stats()
        assert stats["unroutable"] >= 1 and stats["peers_gone"] == {}
    finally:
        for ep in (a, b):
            ep.close()


class _FailingStore(LocalStore):
    def set(self, key: str, value: str | bytes) -> None:
        raise RuntimeError("store down")


def test_an_endpoint_that_fails_to_start_closes_its_sockets() -> None:
    """A store that fails when the endpoint publishes its address: the sockets it
    had bound stayed open (the same ports could not be bound again while the
    error was held, and ResourceWarnings followed)."""
    from dlcp.launch import free_port

    cfg = EndpointConfig(timeout=5.0, data_port=free_port(), control_port=free_port())
    errors = []
    for _ in range(2):  # the second attempt binds the same ports
        try:
            Endpoint(0, store=_FailingStore(), world_size=2, job=JOB, config=cfg)
        except RuntimeError as exc:
            errors.append(exc)  # (held: its frames keep the endpoint alive)
    assert [str(e) for e in errors] == ["store down"] * 2
    ep = Endpoint(0, store=LocalStore(), world_size=2, job=JOB, config=cfg)
    ep.close()


def test_waiting_inside_a_callback_raises_instead_of_freezing_the_endpoint() -> None:
    """A receive's callback that sends a reply and waits for it ran on the I/O
    thread, with the endpoint's lock held: the reply could never move, no
    timeout fired (expiry runs on that thread) and close() hung (a review's
    reproducer). Waiting there raises now; the endpoint goes on."""
    store = LocalStore()
    cfg = EndpointConfig(timeout=10.0)
    a, b = (Endpoint(r, store=store, world_size=2, job=JOB, config=cfg) for r in range(2))
    raised: list[BaseException] = []
    replies: list[Any] = []
    echoed = threading.Event()

    def echo(f: Any) -> None:
        try:
            reply = b.send(f.result().data, to=0, msg=2)
            replies.append(reply)
            reply.result()  # (this thread must move it)
        except RuntimeError as exc:
            raised.append(exc)
        finally:
            echoed.set()

    try:
        got = b.recv(src=0, msg=1)
        got.add_done_callback(echo)
        back = a.recv(src=1, msg=2)
        a.send(X, to=1, msg=1).result(10)
        assert np.array_equal(back.result(10).data, X)  # the reply went all the same
        # (msg 1's STOP leaves before its receive's callback runs, the reply from
        # inside it: the callback may not have returned yet)
        assert echoed.wait(10)
        assert len(raised) == 1 and "would deadlock the endpoint" in str(raised[0])
        assert replies[0].result(10).msg_elems == len(X)  # waited for outside: fine
    finally:
        for ep in (a, b):
            ep.close()
