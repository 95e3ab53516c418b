"""Plans, checks and local endpoints shared by the endpoint integration tests."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dlcp.io import Endpoint, EndpointConfig
from dlcp.proto.config import ProtocolConfig
from tests.integration.peers import MB4, digest, make_data

JOB = 0x2A7
KEY = bytes(range(32))
WRONG_KEY = bytes(range(1, 33))
IS_ROOT = os.geteuid() == 0
MARGIN = 1.5  # seconds an error may come after the configured timeout

root_only = pytest.mark.skipif(not IS_ROOT, reason="needs root")

ETH_P_ALL = 0x0003
#: sll_pkttype of a frame this host sent (AF_PACKET address, third field)
PACKET_OUTGOING = 4


def open_capture() -> socket.socket:
    """A raw AF_PACKET socket on loopback (root), 50 ms receive timeout; skips the
    test where packets cannot be captured."""
    try:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    except (PermissionError, OSError, AttributeError) as exc:
        pytest.skip(f"cannot capture packets here (AF_PACKET): {exc}")
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
    s.bind(("lo", 0))
    s.settimeout(0.05)
    return s


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
