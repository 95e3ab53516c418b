"""Running a benchmark as a user would, for the tests of its command-line contract."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_json(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run ``argv`` in the checkout; check it exits 0; the JSON object on its last
    stdout line."""
    proc = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    detail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{detail}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"nothing on stdout\n{detail}"
    try:
        report = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise AssertionError(f"last stdout line is not JSON ({exc}): {lines[-1]!r}") from None
    assert isinstance(report, dict), f"last stdout line is not one JSON object: {lines[-1]!r}"
    return report


def positive(report: dict[str, Any], key: str) -> float:
    """``report[key]``, checked to be a finite positive number."""
    value = report[key]
    assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
    assert math.isfinite(value) and value > 0, f"{key} = {value!r}, want a positive number"
    return float(value)
