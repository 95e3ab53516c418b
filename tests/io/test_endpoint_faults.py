"""Faults that must stay local to one transfer or one peer, with real endpoints
in this process on loopback.

* A data send the kernel refuses fails that peer's sends, and only those: the
  I/O thread and every other peer carry on. Rank 0's data socket is made to
  refuse rank 2's address (as an nftables ``reject`` or a route that went away
  would): a fault injected into the real endpoint, not a stand-in for it.
* A caller that cancels a send's or a receive's future ends that transfer (the
  peer is told) and nothing else; before, the I/O thread died settling the
  cancelled future, taking every transfer of the endpoint with it.
* A receiver that exits the moment its receive completes (from the future's
  callback) has sent its STOP first: the sender's message completes. Before,
  the future completed before the STOP went out, and the sender failed.
* A data path that drops everything while the control channel works (UDP
  blocked by a firewall) fails that peer's transfer on both sides after the
  silent-path timeout, naming the data path, not after the endpoint's timeout
  with a bare "did not complete"; the other peer's transfer is untouched."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlcp.errors import PeerTimeout, TransferFailed
from dlcp.io import Endpoint, EndpointConfig
from dlcp.io.engine import native_available
from dlcp.proto.config import ProtocolConfig
from tests.io.endpoint_helpers import JOB, LocalStore, dlcp_threads
from tests.io.exit_on_receive_worker import EXIT_RECEIVED
from tests.io.peers import Peer

pytestmark = pytest.mark.integration


def test_a_blackholed_data_path_fails_that_peer_fast_and_names_it() -> None:
    # (the network's silent drop is a stand-in for the Python engine's socket call:
    # the rules under test are the protocol's, which both engines share)
    store = LocalStore()
    cfg = EndpointConfig(timeout=30.0, protocol=ProtocolConfig(silent_path_timeout=1.0),
                         engine="python")
    eps = [Endpoint(r, store=store, world_size=3, job=JOB, config=cfg) for r in range(3)]
    try:
        sender = eps[0]
        real_send = sender._data.send
        dropped_port = eps[2]._data.recv_sock.getsockname()[1]
        dropped = []

        def send(data: Any, segment_size: int, count: int, *, addr: tuple[str, int],
                 **kw: Any) -> Any:  # fmt: skip
            if addr[1] == dropped_port:  # the network drops it, the kernel says nothing
                dropped.append(count)
                return count
            return real_send(data, segment_size, count, addr=addr, **kw)

        sender._data.send = send  # type: ignore[method-assign]
        x = np.arange(200_000, dtype=np.float32)
        started = time.monotonic()
        got1 = eps[1].recv(src=0, msg=1)
        got2 = eps[2].recv(src=0, msg=1)
        to1 = sender.send(x, to=1, msg=1, p=0.05)
        to2 = sender.send(x, to=2, msg=1, p=0.05)
        with pytest.raises(TransferFailed, match=r"to rank 2: .*UDP data path to it drops"):
            to2.result(timeout=10)
        with pytest.raises(TransferFailed, match=r"from rank 0: .*UDP data path from it"):
            got2.result(timeout=10)
        waited = time.monotonic() - started
        assert 0.9 <= waited < 1.0 + 3.0, waited  # the verdict after its 1 s, not the 30 s timeout
        assert dropped, "nothing was dropped: the test did not blackhole the path"
        assert to1.result(timeout=10).acknowledged_elems == len(x)
        assert np.array_equal(got1.result(timeout=10).data, x)
    finally:
        for ep in eps:
            ep.close()
    assert dlcp_threads() == []


@contextlib.contextmanager
def _output_dropped(port: int) -> Iterator[None]:
    """An nftables rule (root) that drops this host's UDP datagrams to ``port`` on
    their way out: the kernel refuses the send with EPERM. Its table, named for
    this process, is removed afterwards."""
    if os.geteuid() != 0 or shutil.which("nft") is None:
        pytest.skip("needs root and nft to make the kernel refuse a send")
    table = f"dlcp_refuse_{os.getpid()}"
    subprocess.run(["nft", "-f", "-"], check=True, text=True, input=(
        f"table inet {table} {{\n chain out {{\n type filter hook output priority 0;\n"
        f" ip daddr 127.0.0.1 udp dport {port} drop\n }}\n}}\n"))  # fmt: skip
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], check=True)


# the Python engine's send is refused by a stand-in for the socket call; the native
# engine's (its own thread's sendmmsg) by the kernel itself, through nftables
@pytest.mark.parametrize("engine", ["python", "native"])
def test_a_refused_data_send_fails_that_peer_only(engine: str) -> None:
    if engine == "native" and not native_available():
        pytest.skip("native engine not built")
    store = LocalStore()
    cfg = EndpointConfig(timeout=10.0, engine=engine)
    eps = [Endpoint(r, store=store, world_size=3, job=JOB, config=cfg) for r in range(3)]
    refusing = contextlib.ExitStack()
    try:
        sender = eps[0]
        real_send = sender._data.send
        refused_port = eps[2]._data.recv_sock.getsockname()[1]

        def send(data: Any, segment_size: int, count: int, *, addr: tuple[str, int],
                 **kw: Any) -> Any:  # fmt: skip
            if addr[1] == refused_port:
                raise PermissionError(errno.EPERM, "Operation not permitted")
            return real_send(data, segment_size, count, addr=addr, **kw)

        if engine == "python":
            sender._data.send = send  # type: ignore[method-assign]
        else:
            refusing.enter_context(_output_dropped(refused_port))
        x = np.arange(50_000, dtype=np.float32)
        out1 = np.empty_like(x)
        got1 = eps[1].recv(src=0, msg=1, out=out1)
        to1 = sender.send(x, to=1, msg=1)
        to2 = sender.send(x, to=2, msg=1)
        with pytest.raises(TransferFailed, match=r"to rank 2: sending data to .* Operation not"):
            to2.result(timeout=10)
        assert to1.result(timeout=10).acknowledged_elems == len(x)
        got1.result(timeout=10)
        assert np.array_equal(out1, x)
        # the endpoint still works: another message to rank 1 after the failure
        again = np.empty_like(x)
        fut = eps[1].recv(src=0, msg=2, out=again)
        sender.send(x, to=1, msg=2).result(timeout=10)
        fut.result(timeout=10)
        assert np.array_equal(again, x)
        assert sender.stats()["data_send_errors"] >= 1
    finally:
        refusing.close()
        for ep in eps:
            ep.close()
    assert dlcp_threads() == []


def test_cancelled_futures_end_their_transfer_only() -> None:
    store = LocalStore()
    cfg = EndpointConfig(timeout=10.0)
    a, b = (Endpoint(r, store=store, world_size=2, job=JOB, config=cfg) for r in range(2))
    try:
        x = np.arange(200_000, dtype=np.float32)
        # the receiver cancels: the sender learns it, the receiver's thread lives on
        rfut = b.recv(src=0, msg=1)
        assert rfut.cancel()
        with pytest.raises(TransferFailed, match="receiver aborted the message"):
            a.send(x, to=1, msg=1).result(timeout=10)
        # the sender cancels a message whose receive is posted: the receive ends
        # well within its timeout, with the data if all of it had left already,
        # else failing with the sender's abort
        got = b.recv(src=0, msg=2)
        pending = a.send(x, to=1, msg=2)
        cancelled = pending.cancel()
        try:
            assert np.array_equal(got.result(timeout=5).data, x)
        except TransferFailed as exc:
            assert cancelled and "aborted" in str(exc), exc
        # both endpoints still move data
        out = np.empty_like(x)
        got = b.recv(src=0, msg=3, out=out)
        a.send(x, to=1, msg=3).result(timeout=10)
        got.result(timeout=10)
        assert np.array_equal(out, x)
    except PeerTimeout:
        pytest.fail("a cancelled transfer left its peer waiting for the timeout")
    finally:
        a.close()
        b.close()
    assert dlcp_threads() == []


def test_close_from_a_callback_under_the_endpoints_lock_does_not_hang() -> None:
    """A future's callback may run in the application thread while it holds the
    endpoint's lock (an operation there settled the future); close() from it must
    not wait for the I/O thread, which needs that lock to finish."""
    ep = Endpoint(0, store=LocalStore(), world_size=2, job=JOB, config=EndpointConfig(timeout=5))
    done = threading.Event()

    def close_inside() -> None:  # what such a callback runs
        ep.close()
        done.set()

    worker = threading.Thread(target=ep._post, args=(close_inside, Future()), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert done.is_set() and not worker.is_alive(), "close() waited for the I/O thread"
    ep.close()  # from outside: waits for the I/O thread, which now finishes
    assert dlcp_threads() == []


def _lossy_pair(loss: float) -> list[Endpoint]:
    """Rank 0 and rank 1 on loopback; rank 1 drops ``loss`` of its data datagrams
    (the seeded emulator), so bounded messages to it complete with some loss."""
    store = LocalStore()
    configs = [
        EndpointConfig(timeout=10.0, emulated_loss=loss if r else 0.0, emulated_loss_seed=3)
        for r in range(2)
    ]
    return [Endpoint(r, store=store, world_size=2, job=JOB, config=configs[r]) for r in range(2)]


def test_a_receive_posted_after_the_message_completed_gets_its_own_fill_and_bound() -> None:
    """A message that completes before its receive is posted completes by the
    sender's bound, zero-filled: the late receive's fill='previous' and a tighter
    p used to be ignored (an all-gather with p_gather > 0 got zeros where its
    estimate belonged)."""
    eps = _lossy_pair(0.03)
    data = np.arange(1, 200_001, dtype=np.float32)
    try:
        # sent and STOPped before any receive is posted: parked as completed
        for msg in (1, 2):
            eps[0].send(data, to=1, msg=msg, p=0.1).result(timeout=20)
        out = np.full_like(data, -7.0)
        got = eps[1].recv(src=0, msg=1, out=out, fill="previous").result(timeout=20)
        lost = got.report.lost_ranges
        assert got.report.lost_elems > 0, "nothing was lost: the test proves nothing"
        assert got.report.fill.value == "previous"
        mask = np.zeros(len(data), bool)
        for off, n in lost:
            mask[off : off + n] = True
        assert (out[mask] == -7.0).all(), "lost elements must keep the buffer's values"
        assert np.array_equal(out[~mask], data[~mask])
        # a bound out of range: an error on the future, and the message stays parked
        with pytest.raises(ValueError, match=r"loss bound p=0\.3 outside"):
            eps[1].recv(src=0, msg=2, out=np.empty_like(data), p=0.3).result(timeout=20)
        # a bound tighter than what was lost: a clear failure, not looser data
        late = r"completed before this receive was posted.*more than p=1e-05 allows"
        with pytest.raises(TransferFailed, match=late):
            eps[1].recv(src=0, msg=2, out=np.empty_like(data), p=1e-5).result(timeout=20)
    finally:
        for ep in eps:
            ep.close()


def test_a_receiver_that_exits_in_its_receives_callback_has_stopped_the_sender(
    tmp_path: Path,
) -> None:
    """The receiving rank, another process, ends itself (``os._exit``) in its
    receive's done-callback, as an application that leaves once it has its data
    may: the STOP for the sender must be on its way by then. It was not: the
    endpoint completed the future from the session's event before sending what
    the session had queued with it, so the callback ran first every time and the
    sender failed ("rank 1 closed its control connection") though the data had
    arrived."""
    n = 1 << 20  # 4 MB of float32: hundreds of datagrams
    timeout = 10.0
    receiver = Peer({"rank": 1, "job": JOB, "n": n, "timeout": timeout},
                    tmp_path / "receiver.stderr", module="tests.io.exit_on_receive_worker")
    store = LocalStore()
    sender = Endpoint(0, store=store, world_size=2, job=JOB, config=EndpointConfig(timeout=timeout))
    try:
        store.add(1, receiver.ready())
        receiver.say(f"peer 0 {sender.address.encode()}")
        receiver.expect("posted", timeout=20)
        sent = sender.send(np.arange(n, dtype=np.float32), to=1, msg=1)
        try:
            report = sent.result(timeout=timeout + 5)
        except TransferFailed as exc:
            pytest.fail(f"the receiver left without stopping the sender: {exc}")
        assert report.acknowledged_elems == n
        code = receiver.proc.wait(timeout=10)
        assert code == EXIT_RECEIVED, f"receiver exited {code}; stderr:\n{receiver.stderr()}"
    finally:
        sender.close()
        receiver.cleanup()
    assert dlcp_threads() == []
