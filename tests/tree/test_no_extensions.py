"""The package as a machine without a C compiler installs it: ``make
test-no-extensions`` builds the wheel with ``CC=false`` (every extension of
``setup.py`` is optional), installs it into a folder of its own and runs this file,
and the tests of what sends data, against that install
(``EXPECT_NO_EXTENSIONS=1``: not a ``DLCP_`` name, which DLCP would refuse as an
unknown setting). Elsewhere this file skips: the normal build has its extensions.

What it checks: none of the four extensions is there, and each module runs its
fallback (numpy kernels, the Python receive loop and engine, ``cryptography``'s
AES-GCM); two endpoints on ``auto`` send with the Python engine, and say so;
the turns benchmark's JSON names the Python engine."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dlcp

pytestmark = pytest.mark.skipif(
    os.environ.get("EXPECT_NO_EXTENSIONS") != "1",
    reason="runs against the install without extensions (make test-no-extensions)",
)


def test_the_install_has_no_extension_modules() -> None:
    package = Path(dlcp.__file__).parent
    assert not list(package.rglob("*.so")), sorted(package.rglob("*.so"))
    from dlcp.io import engine, udp
    from dlcp.proto import auth, kernels

    assert not engine.native_available()
    assert udp._udpio is None
    assert not kernels.ACCELERATED
    assert not auth.ACCELERATED


def test_endpoints_on_auto_send_with_python_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    from tests.io.test_engines import pair

    with caplog.at_level(logging.INFO, logger="dlcp.io"), pair(("auto", "auto")) as (a, b):
        assert a.engine == b.engine == "python"
        data = np.random.default_rng(5).standard_normal(300_000).astype(np.float32)
        out = np.empty_like(data)
        got = b.recv(src=0, msg=1, out=out)
        a.send(data, to=1, msg=1).result(30)
        got.result(30)
        assert np.array_equal(out, data)
        assert a.stats()["engine"] == "python"
    assert "native engine was not built" in caplog.text


def test_a_benchmark_names_the_python_engine() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dlcp.bench.turns", "--json", "--sizes", "1,100000",
         "--messages", "2", "--warmup", "1"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["engine"] == "python" and result["engine_threads"] is None
