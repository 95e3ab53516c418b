"""A data send the kernel refuses fails that peer's transfers, and only those:
the I/O thread and every other peer carry on. Three endpoints in this process on
loopback; rank 0's data socket is made to refuse rank 2's address (as an
nftables ``reject`` or a route that went away would), the way a fault is
injected, not a stand-in for the product."""

from __future__ import annotations

import errno
from typing import Any

import numpy as np
import pytest

from dlcp.errors import TransferFailed
from dlcp.io import Endpoint, EndpointConfig
from tests.integration.endpoint_helpers import JOB, LocalStore, dlcp_threads


def test_a_refused_data_send_fails_that_peer_only() -> None:
    store = LocalStore()
    cfg = EndpointConfig(timeout=10.0)
    eps = [Endpoint(r, store=store, world_size=3, job=JOB, config=cfg) for r in range(3)]
    try:
        sender = eps[0]
        real_send = sender._data.send
        refused_port = eps[2]._data.recv_sock.getsockname()[1]

        def send(data: Any, segment_size: int, count: int, *, addr: tuple[str, int],
                 **kw: Any) -> Any:  # fmt: skip
            if addr[1] == refused_port:
                raise PermissionError(errno.EPERM, "Operation not permitted")
            return real_send(data, segment_size, count, addr=addr, **kw)

        sender._data.send = send  # type: ignore[method-assign]
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
        for ep in eps:
            ep.close()
    assert dlcp_threads() == []
