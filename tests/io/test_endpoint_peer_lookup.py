"""A peer looked up in torch's TCPStore that never publishes its address: send
and receive fail with PeerTimeout naming the peer and the message within the
endpoint's timeout, not after the store's own (here a minute)."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest

from dlcp.errors import PeerTimeout
from dlcp.io import Endpoint, EndpointConfig

pytestmark = pytest.mark.integration

dist = pytest.importorskip("torch.distributed")


@pytest.mark.parametrize("op", ["send", "recv"])
def test_a_peer_missing_from_the_store_times_out_with_the_endpoints_timeout(op: str) -> None:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    with Endpoint(0, store=store, world_size=2, job=7, config=EndpointConfig(timeout=1.0)) as ep:
        started = time.monotonic()
        with pytest.raises(PeerTimeout) as caught:
            if op == "send":
                ep.send(np.ones(4, np.float32), to=1, msg=3, step=2)
            else:
                ep.recv(src=1, msg=3, step=2)
        waited = time.monotonic() - started
    text = str(caught.value)
    assert "rank 1" in text and "step 2, msg 3" in text and "address" in text, text
    assert 0.9 <= waited < 10.0, waited  # the endpoint's 1 s, not the store's 60 s


def test_a_peer_published_in_the_store_is_found() -> None:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    cfg = EndpointConfig(timeout=10.0)
    with Endpoint(0, store=store, world_size=2, job=7, config=cfg) as a:
        fut = None
        with Endpoint(1, store=store, world_size=2, job=7, config=cfg) as b:
            fut = b.recv(src=0, msg=1)
            a.send(np.arange(8, dtype=np.float32), to=1, msg=1).result(timeout=10)
            assert np.array_equal(fut.result(timeout=10).data, np.arange(8, dtype=np.float32))
