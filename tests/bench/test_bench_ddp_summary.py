"""``dlcp.bench.ddp``'s floors under loss are jobs of the loss phase's rounds: the
floor ratios divided a floor measured in an earlier phase (the loopback's
no-communication job, the namespace's lossless UDP floor) by Gloo's lossy
iterations measured later, so the machine's drift between the phases went into
the ratio."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import pytest

from dlcp.bench.ddp import summary, table
from dlcp.bench.ddp_figures import (
    check_job_engines,
    check_python_engine_jobs,
    expected_engine,
    job_env,
)
from dlcp.errors import BenchError


def _config(iter_s: list[float], **extra: Any) -> dict[str, Any]:
    """A configuration as ``_combined`` makes it: the median of its jobs' times."""
    return {"params": 6922, "iter_s": statistics.median(iter_s), "iter_s_jobs": iter_s,
            **extra}  # fmt: skip


def _dlcp(iter_s: list[float]) -> dict[str, Any]:
    return _config(iter_s, lost_fraction=0.0, retransmitted_per_iter=0.0, comm_s=0.001,
                   emulated_loss_dropped=0)  # fmt: skip


def test_the_floor_ratios_under_loss_divide_jobs_of_the_same_rounds() -> None:
    args = argparse.Namespace(nproc=4, inputs=32, width=64, depth=2, batch=32, iters=3,
                              warmup=1, collective="ring", p=0.05, loss=1.0, rounds=3)  # fmt: skip
    res = {
        # earlier phases, on a quieter machine
        "nocomm": _config([0.001]),
        "gloo": _config([0.010, 0.010, 0.010]),
        "dlcp": _dlcp([0.020, 0.020, 0.020]),
        "udpfloor": _config([0.009, 0.009, 0.009]),
        "gloo_netns": _config([0.012, 0.012, 0.012]),
        "dlcp_netns": _dlcp([0.030, 0.030, 0.030]),
        "udpfloor_netns": _config([0.010, 0.010, 0.010]),
        # the loss phase, its jobs in turns: the machine twice as slow by then
        "gloo_loss": _config([0.040, 0.040, 0.040], nft_dropped=10),
        "dlcp_loss": _dlcp([0.050, 0.050, 0.050]) | {"nft_dropped": 10},
        "nocomm_loss": _config([0.002, 0.004, 0.002], nft_dropped=0),
        "udpfloor_loss": _config([0.020, 0.020, 0.020]),
    }
    r = summary(args, res, kernel=True)
    assert r["nocomm_iter_s_loss"] == 0.002
    assert r["floor_ratio_loss"] == 0.05  # 2 ms over 40, not the loopback's 1 ms over 40
    assert r["floor_ratio_loss_rounds"] == [0.05, 0.1, 0.05]
    assert r["udp_floor_iter_s_loss_phase"] == 0.02
    assert r["udp_floor_ratio_loss"] == 0.5  # 20 ms over 40, not the lossless phase's 10
    assert r["udp_floor_ratio_netns_lossless"] == round(0.010 / 0.012, 3)  # (unchanged)


def test_the_python_engines_jobs_are_divided_by_the_jobs_of_their_rounds() -> None:
    """``--python-engine``: the Python engine's jobs against Gloo's and the native
    engine's of the same rounds, in each phase."""
    args = argparse.Namespace(nproc=4, inputs=32, width=64, depth=2, batch=32, iters=3,
                              warmup=1, collective="ring", p=0.05, loss=1.0, rounds=2)  # fmt: skip
    res = {
        "nocomm": _config([0.002]),
        "gloo": _config([0.010, 0.012]),
        "dlcp": _dlcp([0.012, 0.018]),
        "dlcp_python": _dlcp([0.016, 0.020]),
        "gloo_netns": _config([0.020, 0.020]),
        "dlcp_netns": _dlcp([0.024, 0.024]),
        "dlcp_python_netns": _dlcp([0.030, 0.030]),
        "gloo_loss": _config([0.040, 0.040]),
        "dlcp_loss": _dlcp([0.030, 0.036]),
        "dlcp_python_loss": _dlcp([0.045, 0.035]) | {"lost_fraction": 0.01, "nft_dropped": 5},
    }
    py = summary(args, res, kernel=True)["python_engine"]
    assert py["iter_s"] == 0.018  # (the median of two jobs)
    assert py["ratio"] == round(0.018 / 0.011, 3)
    assert py["ratio_rounds"] == [1.6, round(0.020 / 0.012, 3)]
    assert py["ratio_comm_cost"] == round((0.018 - 0.002) / (0.011 - 0.002), 3)
    assert py["native_over_python"] == round(0.015 / 0.018, 3)
    assert py["native_over_python_rounds"] == [0.75, 0.9]
    assert py["ratio_netns_lossless"] == 1.5 and py["native_over_python_netns_lossless"] == 0.8
    assert py["ratio_netns_lossless_rounds"] == [1.5, 1.5]
    assert py["native_over_python_netns_lossless_rounds"] == [0.8, 0.8]
    assert py["comm_cost_s"] == 0.016 and py["iter_s_loss"] == 0.04
    assert py["ratio_loss"] == 1.0 and py["ratio_loss_rounds"] == [1.125, 0.875]
    assert py["native_over_python_loss"] == 0.825
    rounds = [round(0.030 / 0.045, 3), round(0.036 / 0.035, 3)]
    assert py["native_over_python_loss_rounds"] == rounds
    assert py["lost_fraction_loss"] == 0.01 and py["retransmitted_per_iter_loss"] == 0.0
    # nftables' loss: its drops, and no emulator's count (0 would read as "no loss")
    assert py["nft_dropped"] == 5 and py["emulated_loss_dropped"] is None
    # without --python-engine the block is null
    del res["dlcp_python"], res["dlcp_python_netns"], res["dlcp_python_loss"]
    assert summary(args, res, kernel=True)["python_engine"] is None


def test_the_python_engines_jobs_under_emulated_loss_have_no_gloo_ratio() -> None:
    """Without root the loss is DLCP's emulator, on both engines' jobs: their
    iterations and their ratio to each other, no Gloo figures; the table says "-"."""
    args = argparse.Namespace(nproc=2, inputs=32, width=64, depth=2, batch=32, iters=3,
                              warmup=1, collective="ring", p=0.05, loss=1.0, rounds=2)  # fmt: skip
    res = {
        "nocomm": _config([0.002]),
        "gloo": _config([0.010, 0.010]),
        "dlcp": _dlcp([0.012, 0.012]),
        "dlcp_python": _dlcp([0.015, 0.015]),
        "dlcp_loss": _dlcp([0.020, 0.030]) | {"emulated_loss_dropped": 7},
        "dlcp_python_loss": _dlcp([0.025, 0.025]) | {"emulated_loss_dropped": 9},
    }
    r = summary(args, res, kernel=False)
    py = r["python_engine"]
    assert py["iter_s_loss"] == 0.025 and py["emulated_loss_dropped"] == 9
    assert py["nft_dropped"] is None
    assert py["native_over_python_loss"] == 1.0
    assert py["native_over_python_loss_rounds"] == [0.8, 1.2]
    assert py["ratio_loss"] is None and py["ratio_loss_rounds"] is None
    assert py["ratio_netns_lossless"] is None and py["ratio_netns_lossless_rounds"] is None
    text = table(r).splitlines()
    lines = [line for line in text if "Python engine" in line]
    assert len(lines) == 2, lines  # (lossless and loss: no namespace phase)
    assert "over Gloo -;" in lines[1] and "native over Python 1.0" in lines[1], lines[1]
    (loss,) = [line for line in text if line.startswith("  1% loss (emulated")]
    assert "Gloo -  ratio -  (DLCP lost" in loss, loss  # (no Gloo under emulated loss)


def test_the_python_engines_jobs_run_the_python_engine_alone() -> None:
    """A Python-engine job gets DLCP_ENGINE=python and no send threads (the native
    engine's DLCP_ENGINE_THREADS would make its endpoints refuse to start); a job
    whose ranks report another engine than promised fails the run."""
    assert job_env("dlcp_python") == ("dlcp", {"DLCP_ENGINE": "python", "DLCP_ENGINE_THREADS": "1"})
    assert job_env("dlcp") == ("dlcp", {}) and job_env("gloo") == ("gloo", {})
    # the engine a job must report: its own DLCP_ENGINE, else what auto gives the run
    assert expected_engine({"DLCP_ENGINE": "python"}, lambda: "native") == "python"
    assert expected_engine({"DLCP_ENGINE": "native"}, lambda: "python") == "native"
    assert expected_engine({"DLCP_ENGINE": "auto"}, lambda: "native") == "native"
    assert expected_engine({}, lambda: "python") == "python"
    check_job_engines("dlcp_python", ["python", "python"], "python")
    with pytest.raises(BenchError, match=r"dlcp_python job: its ranks ran .*'native'"):
        check_job_engines("dlcp_python", ["python", "native"], "python")
    with pytest.raises(BenchError, match=r"dlcp job: rank\(s\) \[1\] reported no endpoint's"):
        check_job_engines("dlcp", ["native", None], "native")


def test_python_engine_jobs_need_the_native_engine_beside_them() -> None:
    check_python_engine_jobs("native")
    with pytest.raises(BenchError, match=r"--python-engine .* would run the python engine already"):
        check_python_engine_jobs("python")
