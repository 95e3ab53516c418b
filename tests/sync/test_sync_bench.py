"""``python -m dlcp.bench.sync`` / ``dlcp sync``: settings refused with a clear message,
the slow rank's share of iterations, the per-scheme medians; one tiny real run
(two ranks, a few iterations) whose JSON carries every figure."""

from __future__ import annotations

import json

import pytest

from dlcp.bench import sync as bench_sync
from dlcp.cli import main as cli_main


def test_bad_settings_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_sync.main(["--scheme", "nope"]) == 2
    assert "unknown scheme(s) ['nope']" in capsys.readouterr().err
    assert bench_sync.main(["--scheme", "ssp", "--slow-rank", "0"]) == 2
    assert "--slow-rank 0" in capsys.readouterr().err
    assert cli_main(["sync", "run", "--scheme", "ssp", "--workers", "1"]) == 2


def test_the_slow_rank_runs_its_share_only_where_nobody_waits_for_it() -> None:
    cfg = {"steps": 30, "slow_rank": 3, "slowdown": 3, "workers": 4, "seed": 0}
    assert bench_sync._steps_of({**cfg, "scheme": "ssp"}, 3) == 10
    assert bench_sync._steps_of({**cfg, "scheme": "ssp"}, 2) == 30
    assert bench_sync._steps_of({**cfg, "scheme": "bsp"}, 3) == 30
    assert bench_sync._steps_of({**cfg, "scheme": "ripples"}, 3) == 10


def test_medians_per_scheme_and_a_target_not_always_reached() -> None:
    jobs = [{"scheme": "a", "wall_s": w, "iter_s": 0.1, "final_acc": 0.9,
             "time_to_target_s": t, "lost_fraction": 0.0, "mean_staleness": 1.0}
            for w, t in ((1.0, 2.0), (3.0, None), (2.0, 1.0))]  # fmt: skip
    (row,) = bench_sync.summarise(jobs)
    assert row["wall_s"] == 2.0 and row["seeds"] == 3 and row["time_to_target_s"] is None


@pytest.mark.slow
def test_a_tiny_run_reports_every_figure(
    capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    assert bench_sync.main(["--schemes", "allreduce,asp", "--workers", "2", "--steps", "3",
                            "--delay", "0", "--eval-every", "2", "--json",
                            "--out", str(tmp_path)]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["scheme"] for r in result["rows"]] == ["allreduce", "asp"]
    for row in result["rows"]:
        assert row["wall_s"] > 0 and 0 <= row["final_acc"] <= 1
    assert result["config"]["compute"].startswith("real forward/backward + injected delay")
