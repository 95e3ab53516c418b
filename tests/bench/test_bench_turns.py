"""``python -m dlcp.bench.turns``, run as a user would, with few messages.

Checks its contract (exit 0, one JSON object on the last stdout line with the
figures docs/benchmarks.md quotes) and what the counts must be whatever the
machine's load: every message's data arrived (a message arriving different ends
the run non-zero), each side's I/O thread ran at least once per message, and a
message takes at least one control frame each way (its STOP, and its FINISH
unless the STOP came first). Not a performance check; the one count it bounds is
Python's bytecodes per datagram on the native engine, which does not depend on the
machine's speed.
"""

from __future__ import annotations

import sys

import pytest

from dlcp.io.engine import native_available
from tests.bench.bench_helpers import positive, run_json

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("engine", ["native", "python"])
def test_turns_benchmark_json(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if engine == "native" and not native_available():
        pytest.skip("native engine not built")
    monkeypatch.setenv("DLCP_ENGINE", engine)
    if engine == "native":  # (its send threads: the JSON says how many, beside the engine)
        monkeypatch.setenv("DLCP_ENGINE_THREADS", "2")
    else:
        monkeypatch.delenv("DLCP_ENGINE_THREADS", raising=False)
    argv = [sys.executable, "-m", "dlcp.bench.turns", "--json", "--sizes", "1,100000",
            "--messages", "4", "--warmup", "1", "--bytecodes"]  # fmt: skip
    r = run_json(argv, 120.0)
    assert r["bench"] == "turns" and r["engine"] == engine and r["messages"] == 4
    assert r["bytecodes"] is True
    assert r["engine_threads"] == (2 if engine == "native" else None)
    keys = list(r)
    assert keys.index("engine_threads") == keys.index("engine") + 1
    assert set(r["sizes"]) == {"1", "100000"}
    for size, fig in r["sizes"].items():
        for name in ("sender_turns", "receiver_turns", "control_to_sender", "cpu_us", "ms"):
            positive(fig, name)
        assert fig["sender_turns"] >= 1 and fig["receiver_turns"] >= 1, (size, fig)
        assert fig["control_to_sender"] >= 1, (size, fig)  # every message's STOP
        for name in ("bytecodes_caller", "bytecodes_sender_io", "bytecodes_receiver_io"):
            positive(fig, name)  # (each thread posts, sends or receives every message)
        assert fig["bytecodes_other"] == 0, fig  # (one path: no other thread runs)
    # 100,000 float32 elements need at least 273 datagrams of MTU 1500
    assert r["sizes"]["100000"]["datagrams"] >= 273


def test_native_engine_runs_python_per_message_not_per_datagram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 25 MB message (17,362 datagrams) costs the three threads' Python less
    than 2 bytecodes a datagram more than a message of one element (measured: 0.53;
    0.48-0.56 beside two busy loops): Python runs per message and per receive
    call, not per datagram. A Python call per datagram would be dozens a datagram;
    the Python engine, which cuts and sends batches in Python, measured ~7. (A few
    hundred bytecodes per batch of 352 would pass.)"""
    if not native_available():
        pytest.skip("native engine not built")
    monkeypatch.setenv("DLCP_ENGINE", "native")
    monkeypatch.delenv("DLCP_ENGINE_THREADS", raising=False)
    argv = [sys.executable, "-m", "dlcp.bench.turns", "--json", "--sizes", "1,6250000",
            "--messages", "4", "--warmup", "1", "--bytecodes"]  # fmt: skip
    r = run_json(argv, 240.0)
    small, large = r["sizes"]["1"], r["sizes"]["6250000"]
    threads = ("bytecodes_caller", "bytecodes_sender_io", "bytecodes_receiver_io",
               "bytecodes_other")  # fmt: skip
    extra = sum(large[t] - small[t] for t in threads)
    assert large["datagrams"] >= 17_000, large
    assert extra < 2 * large["datagrams"], (small, large)


def test_turns_benchmark_refuses_bad_sizes() -> None:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "dlcp.bench.turns", "--sizes", "0,12"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "--sizes" in proc.stderr, proc.stderr
