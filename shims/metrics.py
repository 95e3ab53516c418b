"""Per-step transport metrics and a Chrome trace (chrome://tracing JSON)."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dlcp.collectives.comm import CollectiveReport

__all__ = ["StepMetrics", "StepSummary", "Tracer", "rank_path"]


@dataclass(frozen=True, slots=True)
class StepSummary:
    """What the transport did during one training step (all buckets)."""

    step: int
    buckets: int
    #: gradient elements of the step's buckets
    elems: int
    #: elements this rank received filled instead of exact (all buckets, all phases)
    lost_elems: int
    #: lost_elems / elems: the share of the step's gradient this rank lost. (A
    #: collective's own report divides by the elements it received under a loss
    #: bound instead, which for a ring is about half of them.)
    lost_fraction: float
    retransmitted_packets: int
    comm_seconds: float
    #: the collective each bucket went through, in order (e.g. "ring_allreduce")
    ops: tuple[str, ...] = ()
    #: buckets whose collective failed (their figures are not in the others)
    failed_buckets: int = 0


@dataclass
class StepMetrics:
    """Collects bucket reports; a step ends with the bucket DDP marks as last."""

    history: list[StepSummary] = field(default_factory=list)
    _open: list[CollectiveReport] = field(default_factory=list)
    _failed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, report: CollectiveReport, *, last_bucket: bool) -> None:
        with self._lock:
            self._open.append(report)
            if last_bucket:
                self._close_step()

    def add_failure(self, *, last_bucket: bool) -> None:
        """A bucket whose collective failed: counted, and the step still ends with
        the last bucket (else the next step's buckets would join this one's)."""
        with self._lock:
            self._failed += 1
            if last_bucket:
                self._close_step()

    def _close_step(self) -> None:
        reps, self._open = self._open, []
        failed, self._failed = self._failed, 0
        elems = sum(r.elems for r in reps)
        lost = sum(r.lost_elems for r in reps)
        self.history.append(
            StepSummary(
                step=len(self.history),
                buckets=len(reps),
                elems=elems,
                lost_elems=lost,
                lost_fraction=lost / elems if elems else 0.0,
                retransmitted_packets=sum(r.retransmitted_packets for r in reps),
                comm_seconds=sum(r.seconds for r in reps),
                ops=tuple(r.op for r in reps),
                failed_buckets=failed,
            )
        )

    def last(self) -> StepSummary | None:
        with self._lock:
            return self.history[-1] if self.history else None


def rank_path(path: str, rank: int, world_size: int) -> str:
    """One file per rank of a job (``trace.json`` -> ``trace.rank1.json``): ranks
    given the same path would write over each other's."""
    if world_size == 1:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))


class Tracer:
    """Complete events ("ph": "X") per collective, written as one JSON file.
    It keeps at most ``max_events`` (the first ones); the file says how many it
    left out (``otherData.dropped_events``)."""

    def __init__(self, path: str, *, max_events: int = 200_000) -> None:
        self.path = Path(path)
        self.max_events = max_events
        self.dropped = 0
        self._events: list[dict[str, object]] = []
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()

    def add(self, report: CollectiveReport) -> None:
        end = time.perf_counter()
        with self._lock:
            if len(self._events) >= self.max_events:
                self.dropped += 1
                return
            self._events.append(
                {
                    "name": f"{report.op} #{report.call}",
                    "cat": "dlcp",
                    "ph": "X",
                    "pid": os.getpid(),
                    "tid": threading.get_ident(),
                    "ts": (end - report.seconds - self._t0) * 1e6,
                    "dur": report.seconds * 1e6,
                    "args": {
                        "elems": report.elems,
                        "lost_fraction": report.lost_fraction,
                        "retransmitted_packets": report.retransmitted_packets,
                        "bytes_sent": report.bytes_sent,
                    },
                }
            )

    def write(self) -> None:
        with self._lock:
            self.path.write_text(
                json.dumps(
                    {
                        "traceEvents": self._events,
                        "displayTimeUnit": "ms",
                        "otherData": {"dropped_events": self.dropped},
                    }
                )
            )
