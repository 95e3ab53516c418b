"""``dlcp.bench.allreduce``'s table says whether DLCP lost values under its bound:
the benchmark runs DLCP at ``p = 0.05`` against Gloo's exact all-reduce, and a run
that lost values compared less work with more without saying so."""

from __future__ import annotations

from typing import Any

from dlcp.bench.allreduce import table


def _result(lost: float) -> dict[str, Any]:
    kinds = {
        f"{k}_{field}": value
        for k in ("ring", "hd", "ps")
        for field, value in (("ms", 2.0), ("cpu_ms", 4.0))
    }
    return {
        "path": "loopback", "elems": 1000, "bytes": 4000, "p": 0.05, "calls_per_kind": 20,
        "gloo_ms": 1.0, "gloo_cpu_ms": 2.0, **kinds, "ratio_ring": 2.0, "ratio_hd": 2.0,
        "ratio_ps": 2.0, "ring_python_ms": None, "floor_ms": None, "floor_error": None,
        "dlcp_lost_fraction": lost,
    }  # fmt: skip


def test_a_run_that_lost_values_says_the_comparison_is_not_like_for_like() -> None:
    shown = table(_result(0.000136))
    assert "DLCP lost 0.0136 % of the values it received under its bound (p = 0.05)" in shown
    assert "not like for like" in shown


def test_a_run_that_lost_nothing_says_so() -> None:
    shown = table(_result(0.0))
    assert "DLCP lost nothing (p = 0.05)" in shown
    assert "not like for like" not in shown
