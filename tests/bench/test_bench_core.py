"""``dlcp.bench.core``: its figures are what it says they are. The ratio is
memcpy time over core time (higher is better), so a run that moved every byte
at least twice (into packets, then into the output) cannot beat one copy; the
throughputs follow from the times; a transfer that is not bit-exact fails the
run instead of being timed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dlcp.bench import core


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, float]:
    assert core.main(["--size-mib", "2", "--repeat", "2", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_ratio_is_memcpy_over_core_and_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(capsys)
    assert r["size_bytes"] == 2 << 20
    # (the seconds are rounded to 0.1 ms, the rates to 1 MB/s: compare the rates)
    assert r["ratio"] == pytest.approx(r["core_gbps"] / r["memcpy_gbps"], rel=0.02, abs=0.002)
    assert r["core_s"] == pytest.approx(r["size_bytes"] / r["core_gbps"] / 1e9, abs=1e-4)
    assert r["memcpy_s"] == pytest.approx(r["size_bytes"] / r["memcpy_gbps"] / 1e9, abs=1e-4)
    assert 0 < r["ratio"] < 1.0, "the core copies every byte twice: it cannot beat one memcpy"
    assert r["engine"] == "python"


def test_a_transfer_that_is_not_exact_fails_the_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = core.Session.receive_batch

    def flip_a_byte(self: core.Session, buf: np.ndarray, seg: int, *, now: float) -> None:
        buf = buf.copy()
        buf[-1] ^= 0xFF  # the last payload byte of the run
        real(self, buf, seg, now=now)

    monkeypatch.setattr(core.Session, "receive_batch", flip_a_byte)
    with pytest.raises(RuntimeError, match="not bit-exact"):
        core.main(["--size-mib", "1", "--repeat", "1", "--json"])
