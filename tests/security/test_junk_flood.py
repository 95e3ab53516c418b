"""Junk floods against live endpoints on loopback, with the C flooder
(``dlcp/bench/flooder.c``, ``sendmmsg`` as fast as one core goes) aimed at the
receiver's data port: random bytes, then datagrams that start like a data header
of the job (right version, type and job id, the rest random). Both send engines,
authentication on and off.

* a stream of 1 MB transfers completes bit-exact under the flood, no rank is
  declared gone and nothing times out: the data socket's kernel filter drops the
  junk before it is queued (counted in the socket's drops), or, with the filter
  off (``kernel_filter=False``), the receive pre-filter drops it in C (counted
  under the session's rejection names, never more often than it was sent); the
  I/O loop still reads the control channel (the first transfer's hello arrives
  during the flood) and runs its timers;
* a receive nobody answers fails by its timeout (``FLOODED_TIMEOUT``, 8 s) within
  ``TIMEOUT_SLACK`` while flooded (earlier, a flood made a 20 s timeout fire 8-11 s
  late).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from dlcp.bench.flooder import Flooder
from dlcp.errors import PeerTimeout
from dlcp.io import Endpoint, EndpointConfig, udp
from dlcp.proto.config import ProtocolConfig
from tests.io.endpoint_helpers import LocalStore

pytestmark = pytest.mark.skipif(udp._udpio is None, reason="dlcp.io._udpio not built")

JOB = 0x2A7
KEY = bytes(range(100, 132))
MB = 1 << 20
TRANSFERS = 12  # per kind of junk
#: how late a timeout may fire under a flood: an I/O turn's bounded data work and
#: the wait for the endpoint's lock on a loaded 2-core machine
TIMEOUT_SLACK = 1.5
#: the endpoints' timeout in the flooded timeout test
FLOODED_TIMEOUT = 8.0
ENGINES = ["native", "python"]


def _pair(
    engine: str, auth: bool, timeout: float = 20.0, kernel_filter: bool = True
) -> tuple[Endpoint, Endpoint]:
    cfg = EndpointConfig(
        protocol=ProtocolConfig(authenticate=auth),
        timeout=timeout,
        engine=engine,
        kernel_filter=kernel_filter,
    )
    store = LocalStore()
    key = KEY if auth else None
    sender = Endpoint(0, store=store, world_size=2, job=JOB, config=cfg, key=key)
    try:
        receiver = Endpoint(1, store=store, world_size=2, job=JOB, config=cfg, key=key)
    except BaseException:
        sender.close()
        raise
    return sender, receiver


@pytest.mark.parametrize(
    ("auth", "kernel_filter"),
    [(False, True), (True, True), (False, False)],
    ids=["plain", "auth", "plain-no-kernel-filter"],
)
@pytest.mark.parametrize("engine", ENGINES)
def test_transfers_complete_exactly_under_a_junk_flood(
    engine: str, auth: bool, kernel_filter: bool
) -> None:
    tx, rx = _pair(engine, auth, kernel_filter=kernel_filter)
    rng = np.random.default_rng(7)
    sent: dict[str, int] = {}
    step = 0
    try:
        assert tx.engine == rx.engine == engine
        for kind in ("random", "header"):
            with Flooder(("127.0.0.1", rx.address.data_port), kind=kind, job=JOB) as flood:
                for _ in range(TRANSFERS):
                    x = rng.standard_normal(MB // 4).astype(np.float32)
                    got = rx.recv(src=0, msg=1, step=step)
                    tx.send(x, to=1, msg=1, step=step).result(timeout=30)
                    received = got.result(timeout=30)
                    assert np.array_equal(received.data, x), f"step {step} differs"
                    step += 1
            assert flood.result is not None and flood.result["sent"] > 0
            sent[kind] = flood.result["sent"]
        rx_stats, tx_stats = rx.stats(), tx.stats()
    finally:
        tx.close()
        rx.close()
    assert rx_stats["peers_gone"] == {} and tx_stats["peers_gone"] == {}
    rejected = rx_stats["rejected"]
    junk_rejected = sum(rejected.values())
    drops = rx_stats["socket_drops"]
    assert rx_stats["kernel_filter"] is kernel_filter
    # the junk reached the receiver and was counted, never more often than it was
    # sent (no genuine datagram was rejected with it)
    assert junk_rejected <= sum(sent.values()), (rejected, sent)
    if kernel_filter:  # in the kernel: the socket's drops (and any genuine datagram
        # that found the buffer full, at most every one sent)
        assert 0 < drops <= sum(sent.values()) + tx_stats["packets_out"], (drops, sent)
    else:
        assert junk_rejected > 0, (rejected, sent)
    if auth:  # a header that passed every other rule still lacks a valid tag
        assert set(rejected) <= {
            "truncated",
            "bad_version",
            "bad_type",
            "wrong_job",
            "bad_field",
            "length_mismatch",
            "out_of_bounds",
            "auth_required",
            "auth_failed",
        }
    print(f"{engine} auth={auth}: flood {sent}, rejected {rejected}, socket drops {drops}")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_timeout_fires_on_time_under_a_junk_flood(engine: str) -> None:
    tx, rx = _pair(engine, auth=False, timeout=FLOODED_TIMEOUT)
    try:
        with Flooder(("127.0.0.1", rx.address.data_port), kind="header", job=JOB) as flood:
            # a transfer first: the sender's hello is read during the flood
            x = np.arange(MB // 4, dtype=np.float32)
            got = rx.recv(src=0, msg=1)
            tx.send(x, to=1, msg=1).result(timeout=30)
            assert np.array_equal(got.result(timeout=30).data, x)
            start = time.monotonic()
            never = rx.recv(src=0, msg=2)  # rank 0 never sends it
            with pytest.raises(PeerTimeout, match=f"did not complete within {FLOODED_TIMEOUT:g} s"):
                never.result(timeout=60)
            late = time.monotonic() - start - FLOODED_TIMEOUT
        stats = rx.stats()
    finally:
        tx.close()
        rx.close()
    assert flood.result is not None and flood.result["sent"] > 0
    # the flood reached the receiver (its kernel filter dropped it, or the pre-filter)
    assert sum(stats["rejected"].values()) + stats["socket_drops"] > 0
    said = f"the {FLOODED_TIMEOUT:g} s timeout fired {late:+.2f} s off"
    assert -0.05 <= late <= TIMEOUT_SLACK, said
    assert stats["peers_gone"] == {}
    print(f"{engine}: timeout {late:+.3f} s late under {flood.result['rate']:.0f} datagrams/s")
