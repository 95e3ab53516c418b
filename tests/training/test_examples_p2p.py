"""The pipeline-parallel and mixture-of-experts examples, launched on 2 local
ranks (``dlcp launch``) over ``"dlcp"`` and over Gloo: the same training.

* ``examples/pipeline_digits.py`` (``torch.distributed.pipelining``, GPipe,
  point-to-point between the stages): the losses are bit for bit Gloo's, the
  model learns;
* ``examples/moe_digits.py`` (tokens routed with ``all_to_all_single``, uneven
  splits, gradients back the same way): the losses match Gloo's (all-reduces of
  the replicated gradients sum in another order), and the model learns.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from dlcp.launch import launch

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2


def run(example: str, backend: str, out: Path, *extra: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCP_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    path = out / f"{Path(example).stem}-{backend}.json"
    stdout, stderr = io.StringIO(), io.StringIO()
    cmd = [sys.executable, str(ROOT / "examples" / example), "--backend", backend,
           "--json", str(path), *extra]
    result = launch(cmd, WORLD, env=env, stdout=stdout, stderr=stderr, timeout=240.0)
    assert result.returncode == 0, (
        f"{result.message}\n--- stdout\n{stdout.getvalue()[-3000:]}\n"
        f"--- stderr\n{stderr.getvalue()[-5000:]}"
    )
    figures: dict[str, Any] = json.loads(path.read_text())
    return figures


@pytest.mark.slow
def test_pipeline_example_trains_as_over_gloo(tmp_path: Path) -> None:
    dlcp = run("pipeline_digits.py", "dlcp", tmp_path, "--epochs", "3")
    gloo = run("pipeline_digits.py", "gloo", tmp_path, "--epochs", "3")
    assert dlcp["losses"] == gloo["losses"], (dlcp, gloo)  # exact messages: same bits
    assert dlcp["losses"][-1] < 0.8 * dlcp["losses"][0], dlcp
    assert dlcp["test_accuracy"] == gloo["test_accuracy"] > 50.0, (dlcp, gloo)


@pytest.mark.slow
def test_mixture_of_experts_example_trains_as_over_gloo(tmp_path: Path) -> None:
    dlcp = run("moe_digits.py", "dlcp", tmp_path, "--epochs", "3")
    gloo = run("moe_digits.py", "gloo", tmp_path, "--epochs", "3")
    for a, b in zip(dlcp["epochs"], gloo["epochs"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3), (a, b)
        assert abs(a["test_accuracy"] - b["test_accuracy"]) <= 2.0, (a, b)
    last = dlcp["epochs"][-1]
    assert last["test_accuracy"] > 50.0, last
    assert all(n > 0 for n in last["expert_tokens"]), last  # both experts used
