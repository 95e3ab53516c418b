"""Instruments for an endpoint's I/O threads, in a benchmark's own process:
wall time per activity (:class:`Timers`, ``dlcp.bench.transport --instrument``)
and a cProfile of each I/O thread (:func:`profile_endpoint_threads`,
``--profile DIR``). Both wrap methods of the classes they time, so they belong
in a worker process that measures, never in a job that trains."""

from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

__all__ = ["Timers", "profile_endpoint_threads"]


class Timers:
    """Wall time the Endpoint I/O threads spend per activity (``--instrument``).

    Wraps methods of the Endpoint, its sockets and its session (in this worker
    process only) with ``perf_counter`` pairs, kept per thread so that an idle
    endpoint's waiting is not mixed with the busy one's. Times are inclusive
    (``flush`` contains ``datagrams_to_send`` and ``sendmsg``) and count from the
    last :meth:`reset` (a ``select`` that began before it counts from it).
    """

    #: (owner, method, label), outermost first; top-level activities have no indent
    POINTS = (
        ("selector", "select", "select (idle or paced wait)"),
        ("Endpoint", "_receive_data", "data socket"),
        ("DataSockets", "receive", "  receive: recvmsg + deliver"),
        ("Session", "receive_batch", "    session.receive_batch"),
        ("Endpoint", "_on_ready", "other ready sockets"),
        ("Session", "receive_datagram", "  session.receive_datagram"),
        ("Endpoint", "_post", "commands (send_message, recv)"),
        ("Session", "handle_timer", "session.handle_timer"),
        ("Endpoint", "_flush", "flush"),
        ("Session", "datagrams_to_send", "  session.datagrams_to_send"),
        ("DataSockets", "send", "  DataSockets.send (sendmsg)"),
        ("Transfers", "dispatch", "events (complete futures)"),
    )

    def __init__(self) -> None:
        self.seconds: defaultdict[tuple[int, str], float] = defaultdict(float)
        self.calls: defaultdict[tuple[int, str], int] = defaultdict(int)
        self.since = time.perf_counter()

    def _wrap(self, owner: Any, name: str, label: str) -> None:
        orig: Callable[..., Any] | None = getattr(owner, name, None)
        if orig is None:  # renamed in dlcp: that activity is simply not timed
            print(f"--instrument: {owner.__name__}.{name} not found", file=sys.stderr)
            return
        seconds, calls = self.seconds, self.calls

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                key = (threading.get_ident(), label)
                seconds[key] += time.perf_counter() - max(t0, self.since)
                calls[key] += 1

        setattr(owner, name, timed)

    def install(self) -> None:
        from dlcp.io import endpoint, readiness, transfers, udp
        from dlcp.proto import session

        owners = {
            "selector": readiness.ReadSelector,  # what Endpoint._run builds
            "Endpoint": endpoint.Endpoint,
            "DataSockets": udp.DataSockets,
            "Transfers": transfers.Transfers,
            "Session": session.Session,
        }
        for owner, name, label in self.POINTS:
            self._wrap(owners[owner], name, label)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()
        self.since = time.perf_counter()

    def take(self, thread: int) -> dict[str, list[float]]:
        """{label: [ms, calls]} of ``thread`` since the last reset, plus the wall
        time and what no activity covers (the loop's own bookkeeping)."""
        wall = time.perf_counter() - self.since
        out: dict[str, list[float]] = {"wall": [round(wall * 1e3, 3), 1]}
        top = 0.0
        for _, _, label in self.POINTS:
            s = self.seconds.get((thread, label))
            if s is not None:
                out[label] = [round(s * 1e3, 3), self.calls[(thread, label)]]
                top += s if not label.startswith(" ") else 0.0
        out["other (loop bookkeeping)"] = [round((wall - top) * 1e3, 3), 0]
        self.reset()
        return out


def profile_endpoint_threads(prefix: str) -> None:
    """cProfile every Endpoint I/O thread (where DLCP's work happens) into
    ``prefix.rank<r>.job<j>`` (``--profile DIR``; read with ``pstats``)."""
    import cProfile

    from dlcp.io.endpoint import Endpoint

    run = Endpoint._run

    def profiled(self: Any) -> None:
        prof = cProfile.Profile()
        try:
            prof.runcall(run, self)
        finally:
            prof.dump_stats(f"{prefix}.rank{self.rank}.job{self.job}")

    Endpoint._run = profiled  # type: ignore[method-assign]
