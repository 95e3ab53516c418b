"""The DDP hook's layer segments: each parameter's layer comes from the model's
module order (front layers first), looked up from the bucket's parameters, so it
survives DDP's bucket rebuild after the first iteration.

* ``DLCPState.segments_for`` on parameter lists in any order and any grouping
  (what DDP's rebuilt buckets hold: reversed, split over several buckets);
* a real single-rank DDP (Gloo over a FileStore) with a capturing wrapper
  around ``dlcp_hook``, 3 iterations: one bucket in model order first, several
  in reverse order after the rebuild, and every parameter keeps its layer, with
  offsets and lengths that match the bucket's flattened gradients.
"""

# no `from __future__ import annotations`: DDP checks the hook's annotations at run
# time and wants the real dist.GradBucket / torch.futures.Future objects

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dlcp.io import Endpoint, EndpointConfig
from shims.ddp import DLCPState, _layer_index, dlcp_hook
from tests.io.endpoint_helpers import JOB, LocalStore, dlcp_threads

pytestmark = pytest.mark.integration

# module path prefix -> layer: the modules that own parameters, in model order
LAYER_OF_MODULE = {"0": 0, "2.0": 1, "2.1": 2, "3": 3, "5": 4}


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32),  # 0
        nn.ReLU(),  # no parameters: no layer
        nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32)),  # 2.0, 2.1
        nn.Linear(32, 24),  # 3
        nn.ReLU(),
        nn.Linear(24, 8),  # 5
    )


def expected_layer(name: str) -> int:
    return LAYER_OF_MODULE[name.rsplit(".", 1)[0]]


@contextlib.contextmanager
def hook_state(model: nn.Module) -> Iterator[DLCPState]:
    """A DLCPState over a single-rank endpoint (world size 1: no peers)."""
    ep = Endpoint(0, store=LocalStore(), world_size=1, job=JOB, config=EndpointConfig(timeout=5))
    state = None
    try:
        state = DLCPState(model=model, p=0.0, endpoint=ep, world_size=1)
        yield state
    finally:
        if state is not None:
            state.close()
        ep.close()
    assert dlcp_threads() == [], "dlcp threads left after close()"


def check_segments(state: DLCPState, names: list[str], params: dict[str, nn.Parameter]) -> None:
    segs = state.segments_for([params[n] for n in names])
    assert len(segs) == len(names)
    offset = 0
    for name, (off, length, layer) in zip(names, segs, strict=True):
        assert (off, length) == (offset, params[name].numel()), name
        assert layer == expected_layer(name), (name, segs)
        offset += length


def test_layer_index_is_module_order() -> None:
    model = build()
    layers = _layer_index(model)
    named = dict(model.named_parameters())
    assert len(layers) == len(named)
    for name, prm in named.items():
        assert layers[id(prm)] == expected_layer(name), name


def test_segments_for_any_order_and_grouping() -> None:
    model = build()
    params = dict(model.named_parameters())
    names = list(params)
    with hook_state(model) as state:
        check_segments(state, names, params)  # model order (DDP's first bucket)
        rev = names[::-1]
        check_segments(state, rev, params)  # DDP's rebuilt order: reverse
        for cut in (1, 3, len(rev) - 1):  # split over two buckets: each re-based to 0
            check_segments(state, rev[:cut], params)
            check_segments(state, rev[cut:], params)
        shuffled = [names[i] for i in torch.randperm(len(names)).tolist()]
        check_segments(state, shuffled, params)
        check_segments(state, [names[4]], params)  # one parameter alone


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_layers_survive_ddp_bucket_rebuild(tmp_path: Path) -> None:
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    try:
        model = build()
        names_of = {id(p): n for n, p in model.named_parameters()}
        # ~4 KB buckets: one bucket in the first iteration, several once rebuilt
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
        calls: list[list[tuple[str, int, int, int]]] = []  # per hook call
        iteration: list[int] = []

        with hook_state(ddp.module) as state:

            def capture(
                st: DLCPState, bucket: dist.GradBucket
            ) -> torch.futures.Future[torch.Tensor]:
                params = bucket.parameters()
                segs = st.segments_for(params)
                flat = bucket.buffer()
                for (off, length, _), grad in zip(segs, bucket.gradients(), strict=True):
                    # the segment is where this parameter's gradient sits in the bucket
                    assert torch.equal(flat[off : off + length], grad.reshape(-1))
                calls.append([(names_of[id(p)], *seg) for p, seg in zip(params, segs, strict=True)])
                iteration.append(step)
                return dlcp_hook(st, bucket)

            ddp.register_comm_hook(state, capture)
            g = torch.Generator().manual_seed(1)
            for step in range(3):  # noqa: B007 - read by capture()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ddp(torch.randn(4, 16, generator=g)).square().sum().backward()
            history = list(state.metrics.history)
    finally:
        dist.destroy_process_group()

    everyone = sorted(n for n, _ in model.named_parameters())
    per_iter = {i: [c for c, it in zip(calls, iteration, strict=True) if it == i] for i in range(3)}
    # the rebuild happened: first iteration one bucket in model order, later several
    assert len(per_iter[0]) == 1
    assert [x[0] for x in per_iter[0][0]] == [n for n, _ in model.named_parameters()]
    for i in (1, 2):
        assert len(per_iter[i]) > 1, per_iter[i]
        assert per_iter[i][0][0][0].startswith("5."), "rebuilt buckets start at the back"
    for i in range(3):
        seen = sorted(name for bucket in per_iter[i] for name, *_ in bucket)
        assert seen == everyone  # every parameter once per iteration
        for bucket in per_iter[i]:
            for name, _, _, layer in bucket:
                assert layer == expected_layer(name), (i, bucket)
    # the hook's own bookkeeping: one step per iteration, all buckets reduced
    assert [h.buckets for h in history] == [len(per_iter[i]) for i in range(3)]


def test_state_refuses_halving_doubling_on_a_world_that_is_not_a_power_of_two() -> None:
    ep = Endpoint(0, store=LocalStore(), world_size=3, job=JOB, config=EndpointConfig(timeout=5))
    try:
        with pytest.raises(ValueError, match="power-of-two number of ranks, got 3"):
            DLCPState(model=build(), collective="halving-doubling", endpoint=ep, world_size=3)
        with pytest.raises(ValueError, match="use one of ring, halving-doubling, ps"):
            DLCPState(model=build(), collective="tree", endpoint=ep, world_size=3)
        # a reduce phase adds what it receives into scratch space: nothing previous to keep
        with pytest.raises(ValueError, match="fill='previous' cannot fill the reduce phase"):
            DLCPState(model=build(), fill="previous", endpoint=ep, world_size=3)
    finally:
        ep.close()
    assert dlcp_threads() == [], "dlcp threads left after close()"
