"""The GPU check's logic on CPU tensors (``--device cpu``): the collectives and
the three trainings run and compare as on a GPU, up to the CUDA calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

SCRIPT = Path(__file__).resolve().parent / "gpu_check.py"


def test_gpu_check_dry_run_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--world-sizes", "2",
         "--steps", "3", "--json", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    entry = report["world_sizes"]["2"]
    assert "error" not in entry, entry["error"]
    assert entry["collectives"] and all(entry["collectives"].values()), entry["collectives"]
    training = entry["training"]
    assert set(training) == {"gloo", "hook", "pg"}
    for mode, figures in training.items():
        assert figures["ok"], (mode, figures)
        assert figures["replicas_max_abs_diff"] == 0.0, mode
        assert figures["iteration_ms_median"] > 0
    assert training["hook"]["staging_ms_per_gradient"] >= 0
    assert report["ok"] is True and proc.returncode == 0


def test_gpu_check_refuses_cuda_without_a_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda"], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "torch.cuda.is_available() is False" in proc.stderr
