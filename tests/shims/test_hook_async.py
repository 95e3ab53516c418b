"""The DDP hook never blocks backward: it hands the bucket to the transport
thread and returns a future at once; the transport thread completes it when the
all-reduce is done. Two ranks in one process (endpoints on loopback); rank 1's
hook is called only after rank 0's returned, so rank 0's all-reduce cannot
have finished when its hook returned. Fake buckets stand in for DDP's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from dlcp.io import Endpoint, EndpointConfig
from shims.ddp import DLCPState, dlcp_hook
from tests.io.endpoint_helpers import JOB, LocalStore, dlcp_threads

pytestmark = pytest.mark.integration


class _Bucket:
    """What dlcp_hook reads of a torch.distributed.GradBucket."""

    def __init__(self, tensor: torch.Tensor, params: list[torch.Tensor], *,
                 last: bool = True) -> None:  # fmt: skip
        self._tensor, self._params, self._last = tensor, params, last

    def buffer(self) -> torch.Tensor:
        return self._tensor

    def parameters(self) -> list[torch.Tensor]:
        return self._params

    def is_last(self) -> bool:
        return self._last


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
        _close(states, eps)
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


def _close(states: list[DLCPState], eps: list[Endpoint]) -> None:
    """The states first (their transport threads use the endpoints), then the endpoints."""
    for s in states:
        s.close()
    for ep in eps:
        ep.close()


def _pair() -> tuple[list[Endpoint], list[torch.nn.Module]]:
    store = LocalStore()
    cfg = EndpointConfig(timeout=20.0)
    eps = [Endpoint(r, store=store, world_size=2, job=JOB, config=cfg) for r in range(2)]
    return eps, [torch.nn.Linear(200, 100) for _ in range(2)]


def _reduce_on_both(states: list[DLCPState], models: list[torch.nn.Module],
                    grads: list[torch.Tensor]) -> list[torch.Tensor]:
    futs = [
        dlcp_hook(s, _Bucket(g, list(m.parameters())))  # type: ignore[arg-type]
        for s, m, g in zip(states, models, grads, strict=True)
    ]
    return [f.wait() for f in futs]


def test_a_second_state_on_the_same_endpoints_continues_the_message_ids() -> None:
    """Re-wrapping a model (after a restore, say) on endpoints passed in: the new
    state's calls must not reuse the ids of calls the peer has completed."""
    eps, models = _pair()
    try:
        for round_ in range(2):
            states = [
                DLCPState(model=models[r], endpoint=eps[r], world_size=2, p=0.0,
                          direct_max_bytes=0)
                for r in range(2)
            ]  # fmt: skip
            try:
                grads = [torch.full((20_100,), float(r + 1 + round_)) for r in range(2)]
                for out in _reduce_on_both(states, models, grads):
                    assert torch.equal(out, torch.full((20_100,), 1.5 + round_))
            finally:
                for s in states:
                    s.close()
    finally:
        for ep in eps:
            ep.close()
    assert dlcp_threads() == []


def test_bfloat16_buckets_are_reduced_through_float32_and_float64_is_refused() -> None:
    eps, models = _pair()
    states = [DLCPState(model=models[r], endpoint=eps[r], world_size=2, p=0.0) for r in range(2)]
    try:
        grads = [torch.full((20_100,), 1.0 + 2.0 * r, dtype=torch.bfloat16) for r in range(2)]
        for out, g in zip(_reduce_on_both(states, models, grads), grads, strict=True):
            assert out is g and out.dtype == torch.bfloat16  # reduced in place, as DDP wants
            assert torch.equal(out, torch.full((20_100,), 2.0, dtype=torch.bfloat16))
        bucket = _Bucket(torch.zeros(20_100, dtype=torch.float64), list(models[0].parameters()))
        with pytest.raises(TypeError, match=r"got a torch\.float64 bucket"):
            dlcp_hook(states[0], bucket)  # type: ignore[arg-type]
    finally:
        for s in states:
            s.close()
        for ep in eps:
            ep.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"p": 0.3}, r"DLCPState: p=0.3 outside \[0, 0.255\]"),
        ({"p": -0.1}, r"DLCPState: p=-0.1 outside"),
        ({"collective": "ps", "servers": [5]}, r"servers=\[5\] must be distinct ranks of 0..1"),
        ({"collective": "ps", "servers": [1, 1]}, r"servers=\[1, 1\] must be distinct"),
        ({"collective": "ps", "servers": []}, r"servers=\[\] must be distinct"),
        ({"servers": [0]}, r"servers= is for collective='ps', not 'ring'"),
        ({"piece_bytes": 4096}, r"piece_bytes= is for collective='ps', not 'ring'"),
        ({"collective": "ps", "piece_bytes": -1}, r"DLCPState: piece_bytes=-1 must be an int >= 0"),
        ({"lanes": 0}, r"DLCPState: lanes=0 outside 1\.\.4"),
        ({"lanes": 5}, r"DLCPState: lanes=5 outside 1\.\.4"),
    ],
)
def test_state_options_are_checked_at_construction(options: dict[str, object],
                                                   message: str) -> None:
    ep = Endpoint(0, store=LocalStore(), world_size=2, job=JOB, config=EndpointConfig(timeout=5))
    try:
        with pytest.raises(ValueError, match=message):
            DLCPState(model=torch.nn.Linear(4, 2), endpoint=ep, world_size=2, **options)  # type: ignore[arg-type]
    finally:
        ep.close()


def test_close_releases_its_endpoint_even_when_the_trace_cannot_be_written(
    tmp_path: Path,
) -> None:
    ep = Endpoint(0, store=LocalStore(), world_size=1, job=JOB, config=EndpointConfig(timeout=5))
    state = DLCPState(model=torch.nn.Linear(4, 2), endpoint=ep, world_size=1,
                      trace_path=str(tmp_path / "missing-dir" / "trace.json"))  # fmt: skip
    state._owns_endpoint = True  # as when the state made the endpoint from env://
    with pytest.raises(FileNotFoundError):
        state.close()
    assert dlcp_threads() == []  # the endpoint's I/O thread is gone


def test_an_array_changed_right_after_send_arrives_as_it_was_sent() -> None:
    """``Endpoint.send`` copies the bytes before it returns (the collectives scale
    and receive into chunks they have sent): 16 MB, more than one pacing decision
    puts on the wire at once, overwritten as soon as ``send`` returns."""
    eps, _ = _pair()
    try:
        data = np.arange(4 << 20, dtype=np.float32)
        out = np.empty_like(data)
        incoming = eps[1].recv(src=0, step=1, msg=9, out=out)
        sent = eps[0].send(data, to=1, step=1, msg=9, p=0.0)
        data[:] = -1.0
        incoming.result(timeout=20)
        sent.result(timeout=20)
        assert np.array_equal(out, np.arange(4 << 20, dtype=np.float32))
    finally:
        for ep in eps:
            ep.close()


def test_a_second_live_state_on_one_endpoint_is_refused_until_the_first_closes() -> None:
    """Two live states on one endpoint would draw call numbers in thread order,
    not the same on every rank (silently wrong sums): the second is refused."""
    from dlcp.errors import ConfigError

    ep = Endpoint(0, store=LocalStore(), world_size=2, job=JOB, config=EndpointConfig(timeout=5))
    try:
        first = DLCPState(model=torch.nn.Linear(4, 2), endpoint=ep, world_size=2)
        with pytest.raises(ConfigError, match="channel 1 of this endpoint belongs to a live"):
            DLCPState(model=torch.nn.Linear(4, 2), endpoint=ep, world_size=2)
        first.close()
        DLCPState(model=torch.nn.Linear(4, 2), endpoint=ep, world_size=2).close()
    finally:
        ep.close()


def test_a_bucket_that_fails_before_its_collective_keeps_later_buckets_paired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Staging a bucket fails on rank 0 alone, with a BaseException (which a torch
    future refuses: it killed the transport thread, and every later bucket hung).
    The failed bucket still uses up its call number and still ends its step in
    the metrics; the next bucket pairs with rank 1's next one (it took the failed
    bucket's number: the two never met)."""
    store = LocalStore()
    cfg = EndpointConfig(timeout=5.0)
    eps = [Endpoint(r, store=store, world_size=2, job=JOB, config=cfg) for r in range(2)]
    models = [torch.nn.Linear(200, 100) for _ in range(2)]
    # (one lane: rank 1 stands in for its own first bucket by taking lane 0's call number)
    states = [DLCPState(model=models[r], endpoint=eps[r], world_size=2, p=0.0, lanes=1)
              for r in range(2)]  # fmt: skip
    try:
        real = states[0]._collective
        failures = iter([SystemExit("injected: staging failed")])

        def flaky(comm: object, data: np.ndarray, segments: list[tuple[int, int, int]]) -> object:
            if (exc := next(failures, None)) is not None:
                raise exc
            return real(comm, data, segments)  # type: ignore[arg-type]

        monkeypatch.setattr(states[0], "_collective", flaky)
        bucket = _Bucket(torch.ones(20_100), list(models[0].parameters()))
        with pytest.raises(RuntimeError, match="SystemExit"):
            dlcp_hook(states[0], bucket).wait()  # type: ignore[arg-type]
        states[1].comm.next_call()  # rank 1's own first bucket (its failure is not the point)
        grads = [torch.full((20_100,), 1.0 + r) for r in range(2)]
        _reduce_on_both(states, models, grads)
        for got in _reduce_on_both(states, models, grads):
            assert torch.equal(got, torch.full((20_100,), 1.5))
        first, *later = states[0].metrics.history
        assert first.failed_buckets == 1 and first.buckets == 0
        assert [s.failed_buckets for s in later] == [0, 0]
    finally:
        for s in states:
            s.close()
        for e in eps:
            e.close()


class _Group:
    """What DLCPState reads of a process group: its size."""

    def __init__(self, n: int) -> None:
        self.n = n

    def size(self) -> int:
        return self.n


def test_a_ddp_over_a_subgroup_is_refused() -> None:
    """The hook averages over the whole job; a DDP over 2 of 4 ranks (hybrid
    parallelism) would have had its gradients averaged with the other half's."""
    store = LocalStore()
    ep = Endpoint(0, store=store, world_size=4, job=JOB, config=EndpointConfig(timeout=5.0))
    try:
        with pytest.raises(ValueError, match=r"process group has 2: .* does not serve"):
            DLCPState(model=torch.nn.Linear(4, 2), endpoint=ep, world_size=4,
                      process_group=_Group(2))  # fmt: skip
        state = DLCPState(model=torch.nn.Linear(4, 2), endpoint=ep, world_size=4,
                          process_group=_Group(4))  # fmt: skip
        state.close()
    finally:
        ep.close()
    assert dlcp_threads() == []


def test_a_callback_on_the_hook_future_may_reduce_another_bucket_and_wait_for_it() -> None:
    """torch's PowerSGD hook waits, inside a ``.then`` callback, for another
    collective of the same transport. The hook's future used to be completed by
    its one transport thread, which then ran that callback and waited for a
    bucket queued behind itself: for ever (torch's ``wait`` has no timeout).
    Each rank chains its callback before the other rank's bucket is submitted,
    so on rank 0 the callback runs on a transport thread, not inline."""
    eps, models = _pair()
    states = [DLCPState(model=models[r], endpoint=eps[r], world_size=2, p=0.0) for r in range(2)]
    outcome: list[object] = []

    def second_reduce(r: int) -> Callable[[torch.futures.Future[torch.Tensor]], torch.Tensor]:
        def callback(first: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            bucket = _Bucket(torch.full((20_100,), 10.0 * (r + 1)), list(models[r].parameters()))
            return first.wait() + dlcp_hook(states[r], bucket).wait()  # type: ignore[arg-type]

        return callback

    def run() -> None:
        try:
            chained = []
            for r in range(2):
                first = dlcp_hook(states[r], _Bucket(torch.full((20_100,), float(r + 1)),  # type: ignore[arg-type]
                                                     list(models[r].parameters())))
                chained.append(first.then(second_reduce(r)))
            outcome.extend(f.wait() for f in chained)
        except BaseException as exc:  # (the test thread asserts on it)
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    try:
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), "a callback that waits for another bucket hung"
        assert len(outcome) == 2, outcome
        for out in outcome:  # mean of 1, 2 plus mean of 10, 20
            assert isinstance(out, torch.Tensor), out
            assert torch.equal(out, torch.full((20_100,), 1.5 + 15.0))
    finally:
        if not worker.is_alive():  # (a hung state cannot close: its thread waits for ever)
            for s in states:
                s.close()
        for ep in eps:
            ep.close()
    assert dlcp_threads() == []


def test_two_lanes_reduce_two_buckets_at_once_and_the_step_counts_both() -> None:
    """Bucket 0 goes to lane 0, bucket 1 to lane 1: on rank 0 the first two
    buckets wait for each other inside their collectives (a barrier of two),
    which only threads of two lanes can pass. Every result is the exact mean,
    and the step, ended by the last bucket, holds both, whichever lane finished
    first."""
    eps, models = _pair()
    states = [DLCPState(model=models[r], endpoint=eps[r], world_size=2, p=0.0, lanes=2)
              for r in range(2)]  # fmt: skip
    both_inside = threading.Barrier(2, timeout=20)
    real = states[0]._collective

    def meeting(comm: object, data: np.ndarray, segments: list[tuple[int, int, int]]) -> object:
        both_inside.wait()  # (BrokenBarrierError: the other bucket was not under way)
        return real(comm, data, segments)  # type: ignore[arg-type]

    states[0]._collective = meeting  # type: ignore[method-assign]
    try:
        futs = [
            [
                dlcp_hook(s, _Bucket(torch.full((20_100,), 10.0 * b + r), list(m.parameters()),  # type: ignore[arg-type]
                                     last=b == 1))
                for b in range(2)
            ]
            for r, (s, m) in enumerate(zip(states, models, strict=True))
        ]  # fmt: skip
        for rank_futs in futs:
            for b, fut in enumerate(rank_futs):
                assert torch.equal(fut.wait(), torch.full((20_100,), 10.0 * b + 0.5))
        for s in states:
            (step,) = s.metrics.history
            assert step.buckets == 2 and step.failed_buckets == 0
    finally:
        _close(states, eps)
    assert dlcp_threads() == []


def test_bucket_outcomes_reach_the_metrics_in_submission_order() -> None:
    """Lane 1's last bucket may finish before lane 0's first: the step waits for
    it, instead of ending without it (and the next step starting with it)."""
    from dlcp.collectives.comm import ReportBuilder
    from shims.ddp import _InOrder
    from shims.metrics import StepMetrics

    metrics = StepMetrics()
    outcomes = _InOrder(metrics)
    outcomes.add(1, ReportBuilder("ring_allreduce", 0, 30).build(), last=True)
    assert metrics.history == []
    outcomes.add(0, ReportBuilder("ring_allreduce", 0, 70).build(), last=False)
    outcomes.add(2, None, last=True)  # a failed bucket ends the next step
    assert [(s.buckets, s.elems, s.failed_buckets) for s in metrics.history] == [
        (2, 100, 0),
        (0, 0, 1),
    ]
