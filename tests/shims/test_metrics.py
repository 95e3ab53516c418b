"""The hook's metrics as a user reads them: the Chrome trace and the per-step history.

* ``Tracer``: real reports of a 2-rank ring all-reduce in this process (exact,
  then with emulated loss and p = 0.05) and hand-made reports go in; the file
  written is chrome://tracing JSON with one complete event ("ph": "X") per
  report, times in microseconds that match the reports' seconds, and the
  report's op, call, elements, bytes, lost fraction and retransmissions;
* ``StepMetrics``: a step closes with the last bucket and sums its buckets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlcp.collectives import CollectiveReport, Communicator, ring_allreduce
from dlcp.collectives.comm import ReportBuilder
from dlcp.io import Endpoint, EndpointConfig
from shims.metrics import StepMetrics, Tracer, rank_path
from tests.io.endpoint_helpers import JOB, LocalStore, dlcp_threads

pytestmark = pytest.mark.integration

N = 200_000


def report(
    op: str = "ring_allreduce",
    call: int = 0,
    *,
    elems: int = 1000,
    lost_elems: int = 0,
    lost_fraction: float = 0.0,
    retransmitted: int = 0,
    seconds: float = 0.001,
) -> CollectiveReport:
    # every other field (new ones too) as an empty report of that op has it
    return dataclasses.replace(
        ReportBuilder(op, call, elems).build(),
        bytes_sent=elems * 4,
        bytes_received=elems * 4,
        lost_elems=lost_elems,
        lost_fraction=lost_fraction,
        retransmitted_packets=retransmitted,
        seconds=seconds,
    )


@contextlib.contextmanager
def two_ranks(**config: Any) -> Iterator[list[Communicator]]:
    store = LocalStore()
    eps: list[Endpoint] = []
    try:
        for rank in range(2):
            cfg = EndpointConfig(timeout=10, emulated_loss_seed=rank, **config)
            eps.append(Endpoint(rank, store=store, world_size=2, job=JOB, config=cfg))
        yield [Communicator(ep, 2) for ep in eps]
    finally:
        for ep in eps:
            ep.close()
    assert dlcp_threads() == [], "dlcp threads left after close()"


def ring_reports(steps: int, **kwargs: Any) -> list[list[CollectiveReport]]:
    """Rank 0's and rank 1's reports of ``steps`` ring all-reduces."""

    def rank_main(comm: Communicator) -> list[CollectiveReport]:
        rng = np.random.default_rng(comm.rank)
        return [
            ring_allreduce(comm, rng.standard_normal(N).astype(np.float32), **kwargs)
            for _ in range(steps)
        ]

    loss = {"emulated_loss": 0.02} if kwargs.get("p", 0) > 0 else {}
    with two_ranks(**loss) as comms, ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(rank_main, c) for c in comms]
        return [f.result(timeout=30 * steps) for f in futs]


def load(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    return doc["traceEvents"]


def check_event(ev: dict[str, Any], rep: CollectiveReport) -> None:
    assert ev["ph"] == "X"
    assert isinstance(ev["ts"], (int, float)) and isinstance(ev["dur"], (int, float))
    assert math.isclose(ev["dur"], rep.seconds * 1e6, rel_tol=1e-9, abs_tol=1e-3)
    assert rep.op in ev["name"] and str(rep.call) in ev["name"]
    assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
    args = ev["args"]
    assert args["elems"] == rep.elems
    assert args["bytes_sent"] == rep.bytes_sent
    assert args["lost_fraction"] == rep.lost_fraction
    assert args["retransmitted_packets"] == rep.retransmitted_packets


@pytest.mark.parametrize("p", [0.0, 0.05], ids=["exact", "loss-p0.05"])
def test_trace_of_real_ring_reports(tmp_path: Path, p: float) -> None:
    path = tmp_path / "trace.json"
    t_before = time.perf_counter()
    tracer = Tracer(str(path))
    t_after = time.perf_counter()
    reports = ring_reports(3, p=p)[0]
    assert [r.call for r in reports] == [0, 1, 2]
    ends = []
    for rep in reports:
        lo = time.perf_counter()
        tracer.add(rep)
        ends.append((lo, time.perf_counter()))
    tracer.write()

    events = load(path)
    assert len(events) == len(reports)
    for ev, rep, (lo, hi) in zip(events, reports, ends, strict=True):
        check_event(ev, rep)
        assert ev["ts"] >= 0  # the tracer existed before the collective started
        # the event ends when the tracer was handed the report, in µs since it was made
        end_us = ev["ts"] + ev["dur"]
        assert (lo - t_after) * 1e6 - 1 <= end_us <= (hi - t_before) * 1e6 + 1
    if p > 0:
        assert any(0 < r.lost_fraction <= p for r in reports), reports
        assert any(ev["args"]["lost_fraction"] > 0 for ev in events)
    else:
        assert all(ev["args"]["lost_fraction"] == 0 for ev in events)


def test_trace_of_given_reports(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "t.json"
    path.parent.mkdir()
    tracer = Tracer(str(path))
    reps = [
        report("ring_allreduce", 7, elems=10, seconds=0.0025),
        report("ps_allreduce", 8, elems=20, lost_elems=1, lost_fraction=0.05, retransmitted=3),
        report("direct_allreduce", 9, elems=30, seconds=0.000125),
    ]
    for rep in reps:
        tracer.add(rep)
    tracer.write()
    events = load(path)
    assert len(events) == 3
    for ev, rep in zip(events, reps, strict=True):
        check_event(ev, rep)
    assert [e["name"].split()[0] for e in events] == [
        "ring_allreduce",
        "ps_allreduce",
        "direct_allreduce",
    ]
    assert events[0]["dur"] == pytest.approx(2500.0)
    assert events[2]["dur"] == pytest.approx(125.0)
    starts = [e["ts"] for e in events]
    ends = [e["ts"] + e["dur"] for e in events]
    assert ends == sorted(ends)  # added one after another
    assert starts[1] == pytest.approx(ends[1] - 1000.0)  # seconds=0.001 by default
    # writing again rewrites the whole file with the events so far
    tracer.add(report("ring_allreduce", 10))
    tracer.write()
    assert len(load(path)) == 4


def test_step_metrics_history() -> None:
    m = StepMetrics()
    assert m.last() is None
    a = report("ring_allreduce", 0, elems=1000, lost_elems=10, retransmitted=2, seconds=0.5)
    b = report("direct_allreduce", 1, elems=3000, lost_elems=30, retransmitted=1, seconds=0.25)
    c = report("ring_allreduce", 2, elems=500, seconds=0.125)
    m.add(a, last_bucket=False)
    assert m.history == [] and m.last() is None  # the step is still open
    m.add(b, last_bucket=True)
    m.add(c, last_bucket=True)
    assert len(m.history) == 2
    s0, s1 = m.history
    assert m.last() == s1
    assert (s0.step, s0.buckets, s0.elems, s0.lost_elems) == (0, 2, 4000, 40)
    assert s0.lost_fraction == pytest.approx(40 / 4000)
    assert s0.retransmitted_packets == 3
    assert s0.comm_seconds == pytest.approx(0.75)
    assert s0.ops == ("ring_allreduce", "direct_allreduce")
    assert (s1.step, s1.buckets, s1.elems, s1.lost_elems, s1.lost_fraction) == (1, 1, 500, 0, 0)
    assert s1.retransmitted_packets == 0 and s1.comm_seconds == pytest.approx(0.125)


def test_a_failed_last_bucket_still_ends_its_step() -> None:
    """Else the next step's buckets joined the open one: the history was a step
    short and that step's figures summed two steps."""
    m = StepMetrics()
    m.add(report("ring_allreduce", 0, elems=1000), last_bucket=False)
    m.add_failure(last_bucket=True)
    m.add(report("ring_allreduce", 2, elems=700), last_bucket=True)
    s0, s1 = m.history
    assert (s0.buckets, s0.elems, s0.failed_buckets) == (1, 1000, 1)
    assert (s1.step, s1.buckets, s1.elems, s1.failed_buckets) == (1, 1, 700, 0)


def test_trace_keeps_a_bounded_number_of_events(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tracer = Tracer(str(path), max_events=3)
    for call in range(5):
        tracer.add(report("ring_allreduce", call))
    tracer.write()
    written = json.loads(path.read_text())
    assert [e["name"] for e in written["traceEvents"]] == [f"ring_allreduce #{c}" for c in range(3)]
    assert written["otherData"] == {"dropped_events": 2}


def test_each_rank_gets_its_own_trace_file() -> None:
    assert rank_path("out/trace.json", 2, 4) == "out/trace.rank2.json"
    assert rank_path("trace.json", 0, 1) == "trace.json"  # one rank: the name as given


def test_step_metrics_from_real_lossy_reports() -> None:
    reports = ring_reports(2, p=0.05)[0]
    m = StepMetrics()
    for i, rep in enumerate(reports):
        m.add(rep, last_bucket=i == len(reports) - 1)
    (step,) = m.history
    assert step.buckets == 2 and step.elems == 2 * N
    assert step.lost_elems == sum(r.lost_elems for r in reports) > 0
    assert 0 < step.lost_fraction <= 0.05
    assert step.retransmitted_packets == sum(r.retransmitted_packets for r in reports)
    assert step.comm_seconds == pytest.approx(sum(r.seconds for r in reports))
    assert step.ops == ("ring_allreduce", "ring_allreduce")
