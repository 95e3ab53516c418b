"""Replays against live endpoints: datagrams that rank 0 would send rank 2 (made
with rank 0's keys by a session of its own, byte for byte what rank 0 sends)
complete rank 2's receive, but replayed to rank 1, which waits for a message
of rank 0 with the same step and msg, every one fails verification and is
counted; replayed into a later run of the job (same secret, same job id, a new
run nonce), they fail there too; replayed to rank 2 once it has forgotten the
message, they verify and are dropped as replayed (their nonces are below rank
0's floor there), and a later message of the same key gets its own values.
Genuine transfers are unaffected."""

from __future__ import annotations

import socket
import time

import numpy as np

from dlcp.io import Endpoint, EndpointConfig
from dlcp.keyring import KeyRing, new_run_nonce
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.session import Session
from tests.io.endpoint_helpers import LocalStore
from tests.security.sent_datagrams import data_datagrams

SECRET = bytes(range(7, 39))
JOB = 0x1D5
AUTH = ProtocolConfig(authenticate=True)
X = np.arange(20_000, dtype=np.float32)


def _run(ring: KeyRing, protocol: ProtocolConfig = AUTH) -> list[Endpoint]:
    store = LocalStore()
    cfg = EndpointConfig(timeout=10.0, protocol=protocol)
    return [Endpoint(r, store=store, world_size=3, job=JOB, config=cfg, key=ring) for r in range(3)]


def _datagrams_of_rank_0_to_rank_2(ring: KeyRing) -> list[bytes]:
    s = Session(rank=0, job=JOB, config=AUTH, key=ring, peers=(0, 1, 2))
    s.send_message(2, X, step=5, msg=9, now=0.0)
    return data_datagrams(s)


def _replay(grams: list[bytes], to: Endpoint) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for g in grams:
            s.sendto(g, ("127.0.0.1", to.address.data_port))


def _rejected(ep: Endpoint, want: int, reason: str = "auth_failed") -> int:
    """``ep``'s count of ``reason`` once it reaches ``want`` (or after 5 s)."""
    deadline = time.monotonic() + 5
    while (n := ep.stats()["rejected"].get(reason, 0)) < want:
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)  # (polls a counter the I/O thread sets; not a readiness guess)
    return n


def test_replays_to_another_destination_and_into_another_run_are_rejected_and_counted() -> None:
    ring1 = KeyRing(SECRET, job=JOB, run_nonce=new_run_nonce())
    first = _run(ring1)
    second: list[Endpoint] = []
    try:
        grams = _datagrams_of_rank_0_to_rank_2(ring1)
        at_1 = first[1].recv(src=0, step=5, msg=9)
        at_2 = first[2].recv(src=0, step=5, msg=9)
        _replay(grams, first[1])  # to another destination
        assert _rejected(first[1], len(grams)) == len(grams)
        assert not at_1.done()
        _replay(grams, first[2])  # the genuine destination: these bytes are rank 0's
        assert np.array_equal(at_2.result(timeout=10).data, X)
        # a later run: same secret and job id, a new run nonce
        second = _run(KeyRing(SECRET, job=JOB, run_nonce=new_run_nonce()))
        later = second[2].recv(src=0, step=5, msg=9)
        _replay(grams, second[2])
        assert _rejected(second[2], len(grams)) == len(grams)
        assert not later.done()
        # genuine transfers, in both runs, are unaffected
        first[0].send(X + 1, to=1, step=5, msg=9).result(timeout=10)
        assert np.array_equal(at_1.result(timeout=10).data, X + 1)
        second[0].send(X + 2, to=2, step=5, msg=9).result(timeout=10)
        assert np.array_equal(later.result(timeout=10).data, X + 2)
        for ep in (*first, *second):
            assert ep.stats()["peers_gone"] == {}
    finally:
        for ep in (*first, *second):
            ep.close()


def test_data_replayed_after_its_receiver_forgot_the_message_is_dropped() -> None:
    memory = 4
    ring = KeyRing(SECRET, job=JOB, run_nonce=new_run_nonce())
    eps = _run(ring, ProtocolConfig(authenticate=True, completed_memory=memory))
    try:
        grams = _datagrams_of_rank_0_to_rank_2(ring)  # (nonces from 0: rank 0's earlier ones)
        first = eps[2].recv(src=0, step=5, msg=9)
        _replay(grams, eps[2])
        assert np.array_equal(first.result(timeout=10).data, X)
        for step in range(6, 7 + memory):  # rank 2 forgets (5, 9)
            got = eps[2].recv(src=0, step=step, msg=9)
            eps[0].send(X + step, to=2, step=step, msg=9).result(timeout=10)
            assert np.array_equal(got.result(timeout=10).data, X + step)
        _replay(grams, eps[2])
        assert _rejected(eps[2], len(grams), "replayed") == len(grams)
        again = eps[2].recv(src=0, step=5, msg=9)  # (the key comes again)
        eps[0].send(X + 1, to=2, step=5, msg=9).result(timeout=10)
        assert np.array_equal(again.result(timeout=10).data, X + 1)
        assert eps[2].stats()["rejected"] == {"replayed": len(grams)}
    finally:
        for ep in eps:
            ep.close()
