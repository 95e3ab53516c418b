"""The README's main job and its example, as a user runs them (smaller: 2 ranks,
1 epoch): ``dlcp train-demo`` trains the digits CNN over DLCP with emulated loss,
then over Gloo, and writes both JSONs and the comparison PNG; the example also
runs under ``torchrun``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCP_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_train_demo_writes_both_runs_and_the_plot(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "dlcp"), "train-demo", "-n", "2", "--epochs", "1", "--results", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    dlcp = json.loads((tmp_path / "digits_dlcp.json").read_text())
    gloo = json.loads((tmp_path / "digits_gloo.json").read_text())
    assert (dlcp["transport"], gloo["transport"]) == ("dlcp", "gloo")
    assert dlcp["p"] == 0.05 and dlcp["emulated_loss"] == 0.01 and dlcp["world_size"] == 2
    (epoch,) = dlcp["epochs"]
    assert 0 < epoch["loss_fraction"] <= 0.05  # emulated loss happened, within the bound
    assert epoch["iter_s"] > 0 and len(epoch["iteration_s"]) == epoch["iterations"]
    assert dlcp["final_test_accuracy"] > 10.0 and gloo["final_test_accuracy"] > 10.0  # > chance
    png = (tmp_path / "digits_dlcp_vs_gloo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "final test accuracy: DLCP" in done.stdout


def test_example_runs_under_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2",
         "examples/train_digits.py", "--transport", "dlcp", "--epochs", "1",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["transport"] == "dlcp" and result["world_size"] == 2
    assert result["final_test_accuracy"] > 10.0


def test_example_says_a_wrong_setting_in_one_line(tmp_path: Path) -> None:
    """A bad DLCP_* variable was a 30-line traceback from every rank."""
    done = subprocess.run(
        [sys.executable, "examples/train_digits.py", "--transport", "dlcp", "--epochs", "1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**_env(), "DLCP_EMULATED_LOSS": "2"},
    )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert said == "dlcp rank 0: DLCP_EMULATED_LOSS=2 outside [0, 1)"


def test_example_with_fewer_ranks_than_world_size_fails_in_one_line_each() -> None:
    """Two ranks started with WORLD_SIZE=3 waited without a word (for torch's 30
    minutes under the DLCP backend); the example bounds the start-up wait by
    DLCP_TIMEOUT + 30 s and says, once per rank, what it waited for."""
    from dlcp.launch import free_port

    job = {**_env(), "DLCP_TIMEOUT": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "WORLD_SIZE": "3"}  # fmt: skip
    cmd = [sys.executable, "examples/train_digits.py", "--transport", "dlcp", "--epochs", "1"]
    ranks = [
        subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**job, "RANK": str(rank), "LOCAL_RANK": str(rank)},
        )
        for rank in (0, 1)
    ]
    for rank, proc in enumerate(ranks):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, err[-2000:]
        assert "Traceback" not in err, err[-2000:]
        said = [line for line in err.splitlines() if line.startswith("dlcp rank")]
        assert len(said) == 1, err[-2000:]
        assert said[0].startswith(f"dlcp rank {rank}: the job did not start within 31 s")
        assert "WORLD_SIZE=3: 3 ranks must start" in said[0]
