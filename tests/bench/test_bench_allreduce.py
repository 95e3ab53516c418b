"""``python -m dlcp.bench.allreduce`` and ``python -m dlcp.bench.messages``, run as a user
would, with few calls.

Checks their contract (exit 0, one JSON object on the last stdout line with the
figures docs/benchmarks.md quotes, positive times) and that they verify what they time:
the all-reduce benchmark ends by checking that the DLCP replicas agree and that
DLCP's lossless all-reduce (and the UDP floor's, as root) gives Gloo's mean (a
wrong result exits non-zero), the
messages benchmark that each message arrived whole. Not a performance check.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from dlcp.io.engine import native_available
from tests.bench.bench_helpers import positive, run_json

pytestmark = pytest.mark.integration


def test_allreduce_benchmark_json_on_the_loopback() -> None:
    argv = [sys.executable, "-m", "dlcp.bench.allreduce", "--json", "--loopback",
            "--iters", "2", "--rounds", "1"]  # fmt: skip
    r = run_json(argv, 180.0)
    assert r["bench"] == "allreduce" and r["path"] == "loopback"
    assert r["world_size"] == 4 and r["bytes"] == 4 * r["elems"]
    for kind in ("gloo", "ring", "ps"):
        positive(r, f"{kind}_ms")
    assert abs(r["ratio_ring"] - r["ring_ms"] / r["gloo_ms"]) < 0.01
    assert 0 <= r["dlcp_lost_fraction"] <= r["p"]
    assert r["engine"] == ("native" if native_available() else "python")
    if r["engine"] == "native":  # the Python engine's ring took its turn beside it
        positive(r, "ring_python_ms")
        if r["ring_python_cpu_ms"] > 0:
            want = r["ring_cpu_ms"] / r["ring_python_cpu_ms"]
            assert abs(r["ring_over_ring_python_cpu"] - want) < 0.01
    else:
        assert r["ring_python_ms"] is None and r["ring_over_ring_python_cpu"] is None
    if os.geteuid() == 0:  # the UDP floor ran too (and gave Gloo's mean, or the run failed)
        positive(r, "floor_ms")
        assert r["floor_error"] is None
        assert abs(r["ring_over_floor"] - r["ring_ms"] / r["floor_ms"]) < 0.01
        # (CPU is counted in clock ticks: two short calls may take none)
        if r["floor_cpu_ms"] > 0:
            assert abs(r["ring_over_floor_cpu"] - r["ring_cpu_ms"] / r["floor_cpu_ms"]) < 0.01
        else:
            assert r["floor_cpu_ms"] == 0 and r["ring_over_floor_cpu"] is None
    else:  # (its receive buffers need root)
        assert r["floor_ms"] is None and r["ring_over_floor_cpu"] is None


@pytest.mark.skipif(os.geteuid() != 0, reason="the floor runs as root only: nothing to leave out")
def test_allreduce_benchmark_without_the_floor() -> None:
    argv = [sys.executable, "-m", "dlcp.bench.allreduce", "--json", "--loopback", "--no-udp-floor",
            "--iters", "1", "--rounds", "1"]  # fmt: skip
    r = run_json(argv, 180.0)
    assert r["floor_ms"] is None and r["ratio_floor"] is None
    positive(r, "ring_ms")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv (to drop CAP_NET_ADMIN)")
def test_a_floor_refused_its_buffers_is_left_out_and_the_rest_stands() -> None:
    # root without CAP_NET_ADMIN (as in many containers): SO_RCVBUFFORCE fails, the
    # floor's buffers stay small, and it would drop a burst it never resends
    argv = ["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin",
            sys.executable, "-m", "dlcp.bench.allreduce", "--json", "--loopback",
            "--iters", "1", "--rounds", "1"]  # fmt: skip
    r = run_json(argv, 180.0)
    assert r["floor_ms"] is None and r["ring_over_floor_cpu"] is None
    assert "CAP_NET_ADMIN" in r["floor_error"]
    positive(r, "ring_ms")


def test_messages_benchmark_json() -> None:
    r = run_json([sys.executable, "-m", "dlcp.bench.messages", "--json"], 120.0)
    assert r["bench"] == "messages" and r["sizes"]
    for phases in r["sizes"].values():
        for key in phases:
            positive(phases, key)
