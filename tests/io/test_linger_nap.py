"""A trickle's nap (``linger_nap`` in ``dlcp/io/_linger.h``) after frames the wait
took itself: it goes on watching the I/O thread's other files, so a caller's
wake-up still ends it at once, and a STOP kept for Python still ends it when due.

(glibc's ``ppoll`` does not write the time left back into its timeout, so a nap
that slept on with that timeout after an absorbed frame slept its whole length
again, deaf to everything.) The harness (``linger_nap_harness.c``) is built with
the system's C compiler and driven without sleeps: each case ends in
microseconds where the nap is right, and sleeps out the harness's 5 s nap where
it is not."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent
IO = HERE.parents[1] / "dlcp" / "io"
NAP_MS = 5000.0

CC = shutil.which("cc") or shutil.which("gcc")


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if CC is None:
        pytest.skip("no C compiler here")
    exe = tmp_path_factory.mktemp("linger") / "linger_nap_harness"
    subprocess.run(
        [CC, "-O1", "-Wall", "-Werror", f"-I{IO}", str(HERE / "linger_nap_harness.c"),
         "-o", str(exe), "-lpthread"],
        check=True,
    )  # fmt: skip
    return exe


def nap(harness: Path, case: str) -> tuple[int, float]:
    out = subprocess.run([str(harness), case], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    m = re.fullmatch(r"returned (\d) after ([\d.]+) ms\n", out.stdout)
    assert m is not None, out.stdout
    return int(m[1]), float(m[2])


def test_a_wake_up_after_an_absorbed_frame_ends_the_nap(harness: Path) -> None:
    returned, ms = nap(harness, "wake")
    assert returned == 0, f"the nap slept on past the wake-up ({ms:.1f} ms)"
    assert ms < NAP_MS / 2


def test_a_stop_kept_for_python_ends_the_nap_when_due(harness: Path) -> None:
    returned, ms = nap(harness, "due")
    assert returned == 1  # (the linger's end: the next call returns 0)
    assert ms < NAP_MS / 2, f"the nap slept {ms:.1f} ms past the STOP's due time"
