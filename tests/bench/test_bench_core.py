"""``dlcp.bench.core``: its figures are what it says they are. The ratio is
memcpy time over core time (higher is better), so the Python engine's run, which
moves every byte at least twice (into packets, then into the output), cannot
beat one copy; the throughputs follow from the times; a transfer that is not
bit-exact fails the run instead of being timed, on either engine's path and
either receive path."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from dlcp.bench import core
from dlcp.io import native_receive
from dlcp.io.engine import native_available

ENGINES = ["python", pytest.param("native", marks=pytest.mark.skipif(
    not native_available(), reason="native engine not built"))]  # fmt: skip
RECEIVE_PATHS = ["python", pytest.param("native", marks=pytest.mark.skipif(
    not native_receive.available(), reason="native receive path not built"))]  # fmt: skip


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert core.main(["--size-mib", "2", "--repeat", "2", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_ratio_is_memcpy_over_core(
    engine: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLCP_ENGINE", engine)
    r = _run(capsys)
    assert r["size_bytes"] == 2 << 20
    # (the seconds are rounded to 0.1 ms, the rates to 1 MB/s: compare the rates)
    assert r["ratio"] == pytest.approx(r["core_gbps"] / r["memcpy_gbps"], rel=0.02, abs=0.002)
    assert r["core_s"] == pytest.approx(r["size_bytes"] / r["core_gbps"] / 1e9, abs=1e-4)
    assert r["memcpy_s"] == pytest.approx(r["size_bytes"] / r["memcpy_gbps"] / 1e9, abs=1e-4)
    assert r["engine"] == engine
    # (no bound on the ratio itself: two 2 MiB copies take a fraction of a
    # millisecond, and one preemption of either on a busy machine moves it past any
    # bound; what the ratio is, is the benchmark's to measure)
    assert r["ratio"] > 0 and r["core_gbps"] > 0 and r["memcpy_gbps"] > 0


@pytest.mark.skipif(not native_available(), reason="native engine not built")
def test_the_native_path_does_not_authenticate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLCP_ENGINE", "native")
    with pytest.raises(SystemExit):  # (argparse's error: exit status 2, the reason on stderr)
        core.main(["--size-mib", "1", "--authenticate"])


@pytest.mark.parametrize("engine", ENGINES)
def test_a_transfer_that_is_not_exact_fails_the_run(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLCP_ENGINE", engine)
    real = core.Session.receive_batch

    def flip_a_byte(self: core.Session, buf: np.ndarray, seg: int, *, now: float) -> None:
        buf = buf.copy()
        buf[-1] ^= 0xFF  # the last payload byte of the run
        real(self, buf, seg, now=now)

    monkeypatch.setattr(core.Session, "receive_batch", flip_a_byte)
    with pytest.raises(RuntimeError, match="not bit-exact"):
        core.main(["--size-mib", "1", "--repeat", "1", "--json", "--receive-path", "python"])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.skipif(not native_receive.available(), reason="native receive path not built")
def test_what_the_c_table_takes_is_checked_too(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the native receive path the data runs go to the C table, not to
    ``receive_batch``: a byte changed in what it takes fails the run as well."""
    monkeypatch.setenv("DLCP_ENGINE", engine)
    real = core.Receiver.take

    def flip_a_byte(self: core.Receiver, step: np.ndarray, segment_size: int) -> None:
        step[-1] ^= 0xFF  # the last payload byte of the step
        real(self, step, segment_size)

    monkeypatch.setattr(core.Receiver, "take", flip_a_byte)
    with pytest.raises(RuntimeError, match="not bit-exact"):
        core.main(["--size-mib", "1", "--repeat", "1", "--json", "--receive-path", "native"])


@pytest.mark.parametrize("path", RECEIVE_PATHS)
def test_the_json_names_the_receive_path_that_ran(
    path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    r = _run(capsys, "--receive-path", path)
    assert r["receive_path"] == path
    assert r["ratio"] > 0


def test_the_default_receive_path_is_the_endpoints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint takes data runs in the C table wherever it was built
    (``native_receive`` on by default), so the benchmark does too; without it,
    asking for that path is an error that says why."""
    r = _run(capsys)
    assert r["receive_path"] == ("native" if native_receive.available() else "python")
    monkeypatch.setattr(native_receive, "available", lambda: False)
    assert _run(capsys)["receive_path"] == "python"
    with pytest.raises(SystemExit):  # (argparse's error: exit status 2)
        core.main(["--size-mib", "1", "--receive-path", "native"])
    assert "not built" in capsys.readouterr().err
