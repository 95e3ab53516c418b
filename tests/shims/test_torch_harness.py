"""A time-bounded subset of torch's own distributed test harness against the
``"dlcp"`` backend (tests/torch_suite/run_suite.py, world size 3): point-to-point,
all-to-all, collectives, barrier and timeouts.

Each test named here must pass: a failure, an error or a skip (a harness that
decided not to run it) fails this test. The ranks are forked from the test
process (TORCH_SUITE_FORK=1): spawning them imports torch and the harness again
in every rank, seconds of CPU per test on a small machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

pytest.importorskip("torch.distributed")

ROOT = Path(__file__).resolve().parents[2]
SUITE = "tests/torch_suite/run_suite.py"
CLASS = "TestDistBackendWithSpawn"

#: shown to the harness as Gloo (DRESS_AS_GLOO=1): its CPU tests run for Gloo by name
AS_GLOO = [
    "test_send_recv_with_tag",
    "test_send_recv_any_source",
    "test_batch_isend_irecv_gloo_tags",
    "test_all_reduce_sum",
    "test_all_reduce_max",
    "test_broadcast",
    "test_all_gather_coalesced_simple",
    "test_reduce_product",
    "test_scatter",
    "test_barrier_full_group",
    "test_barrier_timeout_full_group",
    "test_monitored_barrier_gloo_rank_0_timeout",
]
#: shown to the harness as MPI (DRESS_AS_MPI=1): it runs its CPU all-to-all tests
#: for MPI only
AS_MPI = [
    "test_all_to_all_single_unequal_split",
    "test_all_to_all_group",
]


def outcomes(xml: Path) -> dict[str, str]:
    result = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        result[case.get("name", "?")] = kinds[0] if kinds else "passed"
    return result


@pytest.mark.parametrize(("dress", "names"), [("GLOO", AS_GLOO), ("MPI", AS_MPI)])
def test_torch_harness_subset(tmp_path: Path, dress: str, names: list[str]) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("BACKEND", "DRESS_AS_GLOO", "DRESS_AS_MPI")
    }
    env.update({f"DRESS_AS_{dress}": "1", "WORLD_SIZE": "3", "TORCH_SUITE_FORK": "1"})
    env["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = "240"
    xml = tmp_path / "results.xml"
    ids = [f"{SUITE}::{CLASS}::{n}" for n in names]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *ids],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert xml.exists(), f"the harness did not run (rc {proc.returncode}):\n{proc.stdout[-4000:]}"
    got = outcomes(xml)
    bad = {n: got.get(n, "not run") for n in names if got.get(n) != "passed"}
    assert not bad, f"torch harness tests not passed: {bad}\n{proc.stdout[-6000:]}"
    assert proc.returncode == 0, proc.stdout[-4000:]
