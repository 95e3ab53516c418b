"""``python -m dlcp.bench.ddp``, run as a user would, on a tiny model and two ranks.

Checks the benchmark's contract (exit 0, one JSON object on the last stdout
line with the figures docs/benchmarks.md uses) and that its figures are
consistent with each other: every iteration time is a positive number, the
communication costs are the transports' iterations less the no-communication
floor, and the ratios are the quotients they claim to be. No figure is compared
with a speed: this is not a performance check. ``--emulated`` keeps it on the
loopback even as root (the namespace phases are the transport benchmark's
business to test), so Gloo's loss fields are null.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from tests.bench.bench_helpers import positive, run_json

pytestmark = pytest.mark.integration

TIMEOUT = 300.0  # seconds: up to nine jobs of two ranks, each importing torch

ARGV = [
    sys.executable, "-m", "dlcp.bench.ddp", "--json", "--emulated",
    "--iters", "3", "--warmup", "1", "--width", "64", "--depth", "2", "--inputs", "32",
    "--rounds", "2", "--nproc", "2",
]


def _native_engine_runs() -> bool:
    from dlcp.bench.outcome import engine_of_run

    return engine_of_run() == "native"


def _run() -> dict[str, Any]:
    # where DLCP's jobs run the native engine, its jobs on the Python engine take
    # their turns too (--python-engine refuses a run whose jobs are the Python
    # engine's already: tests/bench/test_bench_ddp_summary.py)
    return run_json(ARGV + ["--python-engine"] * _native_engine_runs(), TIMEOUT)


HALF = 5e-5  # half the JSON's rounding step of a time


def _is_quotient(ratio: float, a: float, b: float) -> None:
    """``ratio`` (rounded to 3 decimals) is the quotient of the unrounded times
    that ``a`` and ``b`` (rounded to 4) stand for."""
    low, high = (a - HALF) / (b + HALF), (a + HALF) / (b - HALF)
    assert low - 1e-3 <= ratio <= high + 1e-3, (ratio, a, b)


def test_ddp_benchmark_json_and_its_no_communication_floor() -> None:
    r = _run()
    assert r["bench"] == "ddp" and r["world_size"] == 2, r
    # 32-64-64-10 MLP: (32*64 + 64) + (64*64 + 64) + (64*10 + 10)
    assert r["params"] == 6922, r["params"]
    dlcp, gloo, floor = (positive(r, k) for k in ("dlcp_iter_s", "gloo_iter_s", "nocomm_iter_s"))
    # (the JSON rounds every time to 4 decimals and every ratio to 3)
    assert abs(r["dlcp_comm_cost_s"] - (dlcp - floor)) <= 2e-4, r
    assert abs(r["gloo_comm_cost_s"] - (gloo - floor)) <= 2e-4, r
    _is_quotient(r["ratio"], dlcp, gloo)
    # Gloo and DLCP took turns, two jobs each: a ratio per round
    assert r["rounds"] == 2 and len(r["ratio_rounds"]) == 2, r
    assert min(r["ratio_rounds"]) - 1e-3 <= r["ratio"] <= max(r["ratio_rounds"]) + 1e-3, r
    dc, gc = r["dlcp_comm_cost_s"], r["gloo_comm_cost_s"]
    if gc > 2 * HALF and dc > HALF:
        _is_quotient(r["ratio_comm_cost"], dc, gc)
    # emulated loss: DLCP alone, Gloo's loss figures and the floor's ratio null
    assert r["loss_method"] == "emulated", r["loss_method"]
    positive(r, "dlcp_iter_s_loss")
    for key in ("gloo_iter_s_loss", "ratio_loss", "floor_ratio_loss", "nocomm_iter_s_loss",
                "udp_floor_iter_s_loss_phase"):
        assert r[key] is None, f"{key} = {r[key]!r} under emulated loss, want null"
    assert r["emulated_loss_dropped"] > 0, "the emulator dropped nothing: no loss was measured"
    # the UDP floor: as root on the loopback, in turns with the others; never under loss
    assert r["udp_floor_iter_s_netns_lossless"] is None and r["udp_floor_ratio_loss"] is None, r
    if os.geteuid() == 0:
        _is_quotient(r["udp_floor_ratio"], positive(r, "udp_floor_iter_s"), gloo)
    else:
        assert r["udp_floor_iter_s"] is None and r["udp_floor_ratio"] is None, r
    # each DLCP job's ranks reported the engine they ran: the run's (a mismatch fails it)
    assert r["dlcp_engines"] == [r["engine"]] * 2, (r["dlcp_engines"], r["engine"])
    # the Python engine's jobs, in the same turns: their own ratios to Gloo and to them
    py = r["python_engine"]
    if r["engine"] != "native":
        assert py is None, py
        return
    # (each job's ranks said which engine they ran: the run fails on a mismatch)
    assert py["engines"] == ["python", "python"], py
    python = py["iter_s"]
    assert python > 0, py
    _is_quotient(py["ratio"], python, gloo)
    _is_quotient(py["native_over_python"], dlcp, python)
    assert len(py["ratio_rounds"]) == 2 and len(py["native_over_python_rounds"]) == 2, py
    # the Python engine's jobs suffered the emulated loss too, and were timed
    assert py["emulated_loss_dropped"] > 0, "the Python engine's jobs lost nothing"
    assert py["iter_s_loss"] > 0, py
    _is_quotient(py["native_over_python_loss"], r["dlcp_iter_s_loss"], py["iter_s_loss"])
    assert py["ratio_loss"] is None, py  # (emulated: no Gloo under loss)
