"""The DDP hook never blocks backward: it hands the bucket to the transport
thread and returns a future at once; the transport thread completes it when the
all-reduce is done. Two ranks in one process (endpoints on loopback); rank 1's
hook is called only after rank 0's returned, so rank 0's all-reduce cannot
have finished when its hook returned. Fake buckets stand in for DDP's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dlcp.shims.ddp import DLCPState, dlcp_hook

from dlcp.io import Endpoint, EndpointConfig
from tests.integration.endpoint_helpers import JOB, LocalStore, dlcp_threads


class _Bucket:
    """What dlcp_hook reads of a torch.distributed.GradBucket."""

    def __init__(self, tensor: torch.Tensor, params: list[torch.Tensor]) -> None:
        self._tensor, self._params = tensor, params

    def buffer(self) -> torch.Tensor:
        return self._tensor

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def is_last(self) -> bool:
        return True


def test_the_hook_returns_before_the_all_reduce_and_the_future_completes_it() -> None:
    store = LocalStore()
    cfg = EndpointConfig(timeout=20.0)
    eps = [Endpoint(r, store=store, world_size=2, job=JOB, config=cfg) for r in range(2)]
    states: list[DLCPState] = []
    try:
        models = [torch.nn.Linear(200, 100) for _ in range(2)]
        for r in range(2):
            states.append(
                DLCPState(model=models[r], endpoint=eps[r], world_size=2, p=0.0, collective="ring",
                          direct_max_bytes=0)
            )  # fmt: skip
        grads = [torch.full((20_100,), float(r + 1)) for r in range(2)]
        buckets = [_Bucket(g, list(m.parameters())) for g, m in zip(grads, models, strict=True)]
        first = dlcp_hook(states[0], buckets[0])  # type: ignore[arg-type]
        assert not first.done(), "the hook waited for the all-reduce"
        second = dlcp_hook(states[1], buckets[1])  # type: ignore[arg-type]
        for fut in (first, second):
            out = fut.wait()
            assert np.array_equal(out.numpy(), np.full(20_100, 1.5, np.float32))  # mean of 1, 2
        assert all(s.metrics.history and s.metrics.history[-1].buckets == 1 for s in states)
    finally:
        for s in states:
            s.close()
        for ep in eps:
            ep.close()
    assert dlcp_threads() == []


def test_close_refuses_later_buckets_and_closes_only_its_own_endpoint() -> None:
    ep = Endpoint(0, store=LocalStore(), world_size=1, job=JOB, config=EndpointConfig(timeout=5))
    try:
        model = torch.nn.Linear(4, 2)
        state = DLCPState(model=model, endpoint=ep, world_size=1)
        state.close()
        state.close()  # twice is harmless
        bucket = _Bucket(torch.zeros(10), list(model.parameters()))
        # a bucket after close() fails at once instead of waiting for ever
        with pytest.raises(RuntimeError, match="DLCPState is closed"):
            dlcp_hook(state, bucket)  # type: ignore[arg-type]
        assert ep.stats()["peers_gone"] == {}  # the endpoint passed in is still open
    finally:
        ep.close()
    assert dlcp_threads() == []
