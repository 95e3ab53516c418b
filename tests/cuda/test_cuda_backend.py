"""DLCP on CUDA tensors: 2 ranks sharing one GPU run each of the dlcp process
group's operations on device tensors, then train the digits CNN over Gloo, over
DLCP's DDP hook and over ``init_process_group("dlcp")``, and must match Gloo
(tests/cuda/gpu_check.py). Skipped without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check  # noqa: E402


def test_collectives_on_cuda_tensors() -> None:
    checks = gpu_check.launch(2, "collectives", "cuda", steps=1)
    failed = sorted(k for c in checks for k, right in c.items() if not right)
    assert not failed, f"wrong results on CUDA tensors: {failed}"


def test_training_on_cuda_matches_gloo() -> None:
    runs = {mode: gpu_check.launch(2, mode, "cuda", steps=5) for mode in gpu_check.MODES}
    report = gpu_check.compare(runs)
    assert all(entry["ok"] for entry in report.values()), report
