"""Plans, checks and local endpoints shared by the endpoint integration tests."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dlcp.io import Endpoint, EndpointConfig
from dlcp.proto.config import ProtocolConfig
from tests.io.peers import MB4, digest, make_data

JOB = 0x2A7
KEY = bytes(range(32))
WRONG_KEY = bytes(range(1, 33))
IS_ROOT = os.geteuid() == 0
MARGIN = 1.5  # seconds an error may come after the configured timeout

root_only = pytest.mark.skipif(not IS_ROOT, reason="needs root")


def closed_endpoint(rank: int) -> str:
    """What a rank whose peer ``rank`` closed its endpoint (or died) says of it:
    whichever end of their two control connections it handled first (the one
    from the peer, or the one it opened to the peer: closed, or reset), each
    checked against the peer's port, which refuses."""
    return (
        f"rank {rank} closed its control connection"
        f"|control connection to rank {rank} ended \\(.+\\) and rank {rank} "
        "no longer accepts control connections"
    )

ETH_P_ALL = 0x0003
#: sll_pkttype of a frame this host sent (AF_PACKET address, third field)
PACKET_OUTGOING = 4


def _port_filter(udp_dst: int, tcp_ports: tuple[int, ...]) -> bytes:
    """A classic BPF program (``struct sock_fprog``'s instructions) that keeps the
    loopback frames of IPv4 UDP to ``udp_dst`` and IPv4 TCP from or to any of
    ``tcp_ports``, and drops every other frame in the kernel."""
    # (code, jump-if-true label, jump-if-false label, k); labels resolve to offsets
    ld_h, ld_b, ldx_msh, ld_ind_h, jeq, ret = 0x28, 0x30, 0xB1, 0x48, 0x15, 0x06
    prog: list[tuple[int, str | int, str | int, int] | str] = [
        (ld_h, 0, 0, 12), (jeq, 0, "drop", 0x0800),  # IPv4
        (ld_b, 0, 0, 23), (jeq, 0, "tcp", 17),  # UDP ...
        (ldx_msh, 0, 0, 14), (ld_ind_h, 0, 0, 16), (jeq, "keep", "drop", udp_dst),
        "tcp", (jeq, 0, "drop", 6),  # ... or TCP
        (ldx_msh, 0, 0, 14), (ld_ind_h, 0, 0, 14),  # source port
        *[(jeq, "keep", 0, port) for port in tcp_ports],
        (ld_ind_h, 0, 0, 16),  # destination port
        *[(jeq, "keep", 0, port) for port in tcp_ports],
        (ret, 0, 0, 0),
        "keep", (ret, 0, 0, 1 << 18),
        "drop", (ret, 0, 0, 0),
    ]  # fmt: skip
    labels, at = {}, 0
    for item in prog:
        if isinstance(item, str):
            labels[item] = at
        else:
            at += 1
    code, at = b"", 0
    for item in prog:
        if isinstance(item, str):
            continue
        op, jt, jf, k = item
        jt = labels[jt] - at - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - at - 1 if isinstance(jf, str) else jf
        code += struct.pack("HBBI", op, jt, jf, k)
        at += 1
    return code


class LoopbackCapture:
    """The frames one test's own traffic puts on loopback, and only those: a BPF
    filter in the kernel keeps IPv4 UDP to ``udp_dst`` and TCP from or to
    ``tcp_ports``, attached before the socket sees any frame, so that other jobs on
    the machine neither fill its buffer nor reach the reader. A thread reads while
    the test runs; :meth:`stop`, called once the test's traffic has ended (a real
    signal: the transfer's results), reads what is still queued without waiting for
    more and returns every outgoing frame, in wire order. ``drops`` counts frames
    the kernel had to drop for want of buffer."""

    def __init__(self, *, udp_dst: int, tcp_ports: tuple[int, ...] = ()) -> None:
        try:
            # protocol 0: no frame is queued until bind(), after the filter is on
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        except (PermissionError, OSError, AttributeError) as exc:
            pytest.skip(f"cannot capture packets here (AF_PACKET): {exc}")
        code = _port_filter(udp_dst, tcp_ports)
        buf = ctypes.create_string_buffer(code)
        fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))
        s.setsockopt(socket.SOL_SOCKET, 26, fprog)  # SO_ATTACH_FILTER
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
        s.bind(("lo", ETH_P_ALL))
        s.settimeout(0.05)
        self._sock = s
        self._stop = threading.Event()
        self.frames: list[bytes] = []
        self.drops = 0
        self._thread = threading.Thread(target=self._read, name="test-capture")
        self._thread.start()

    def _read(self) -> None:
        while True:
            stopping = self._stop.is_set()
            try:
                frame, addr = self._sock.recvfrom(1 << 17, socket.MSG_DONTWAIT if stopping else 0)
            except (TimeoutError, BlockingIOError):
                if stopping:
                    return
                continue
            if addr[2] == PACKET_OUTGOING:
                self.frames.append(frame)

    def stop(self) -> list[bytes]:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=30)
            assert not self._thread.is_alive(), "capture thread did not stop"
            # struct tpacket_stats {tp_packets, tp_drops} (SOL_PACKET, PACKET_STATISTICS)
            self.drops = struct.unpack("II", self._sock.getsockopt(263, 6, 8))[1]
            self._sock.close()
        return self.frames


def plan(rank: int, ops: list[dict[str, Any]], *, timeout: float = 15.0,
         protocol: dict[str, Any] | None = None, key: bytes | None = None,
         host: str = "127.0.0.1", **config: Any) -> dict[str, Any]:
    return {"rank": rank, "world_size": 2, "job": JOB, "host": host,
            "key": key.hex() if key else None, "config": {"timeout": timeout, **config},
            "protocol": protocol or {}, "ops": ops, "wait_timeout": 30.0}


def send(msg: int, *, to: int = 1, kind: str = "float32", n: int = MB4, seed: int | None = None,
         p: float = 0.0, step: int = 0, layers: int = 8) -> dict[str, Any]:
    return {"op": "send", "to": to, "msg": msg, "step": step, "kind": kind, "n": n,
            "seed": msg * 1000 + step if seed is None else seed, "p": p, "layers": layers}


def recv(msg: int, *, src: int = 0, kind: str = "float32", n: int = MB4,
         seed: int | None = None, step: int = 0) -> dict[str, Any]:
    return {"op": "recv", "src": src, "msg": msg, "step": step, "kind": kind, "n": n,
            "seed": msg * 1000 + step if seed is None else seed}


def ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["ok"], f"{result['error']}: {result['message']}"
    return result


def assert_exact(rx: dict[str, Any], tx: dict[str, Any], op: dict[str, Any]) -> None:
    """The receiver got exactly what the sender sent (and the parent regenerates)."""
    ok(rx), ok(tx)
    want, _ = make_data(op["kind"], op["n"], op["seed"])
    assert rx["report"]["lost_elems"] == 0, (rx["report"], tx["report"])
    assert rx["report"]["lost_ranges"] == []
    assert rx["mismatched_outside_lost"] == 0, (rx["mismatch_sample"], rx["report"], op)
    assert rx["sha256"] == tx["sha256"] == digest(want)


def assert_within_bound(rx: dict[str, Any], p: float) -> None:
    """Completed within the bound; exact where received, zero-filled where lost;
    only drop-eligible chunks lost (protected ones are always recovered)."""
    ok(rx)
    rep = rx["report"]
    assert rep["lost_fraction"] <= p
    assert rx["lost_mask_elems"] == rep["lost_elems"] == rep["msg_elems"] - rep["received_elems"]
    assert rx["mismatched_outside_lost"] == 0
    assert rx["nonzero_in_lost"] == 0
    assert sum(rep["lost_chunks"][0::2]) == 0, f"protected chunks lost: {rep['lost_chunks']}"


def dlcp_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dlcp")]


class LocalStore:
    """An in-process ``store=`` that the test fills with a worker's address."""

    def __init__(self) -> None:
        self._known: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key: str, value: str | bytes) -> None:
        with self._cond:
            self._known[key] = value.encode() if isinstance(value, str) else value
            self._cond.notify_all()

    def get(self, key: str) -> bytes:
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._known, 10.0):
                raise KeyError(key)
            return self._known[key]

    def check(self, keys: list[str]) -> bool:
        """Whether every key is set (torch's ``Store.check``), without waiting."""
        with self._cond:
            return all(k in self._known for k in keys)

    def add(self, rank: int, address: str) -> None:
        self.set(f"dlcp/{JOB}/addr/{rank}", address)


@contextlib.contextmanager
def local_endpoint(rank: int = 0, **config: Any) -> Iterator[tuple[Endpoint, LocalStore]]:
    store = LocalStore()
    protocol = config.pop("protocol", ProtocolConfig())
    ep = Endpoint(rank, store=store, world_size=2, job=JOB,
                  config=EndpointConfig(protocol=protocol, **config))
    try:
        yield ep, store
    finally:
        ep.close()
    assert dlcp_threads() == [], "dlcp threads left after close()"
