"""The machine a benchmark's JSON says it ran on (dlcp.bench.machine)."""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path

import pytest

from dlcp.bench.machine import cpu_times, describe
from dlcp.bench.outcome import finish
from dlcp.proto import auth

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 aes pclmulqdq avx2 hypervisor avx512f vaes

processor\t: 1
model name\t: another CPU that is not read
flags\t\t: fpu
"""


def _proc(tmp_path: Path, stat: str, cpuinfo: str = CPUINFO) -> Path:
    (tmp_path / "stat").write_text(stat)
    (tmp_path / "cpuinfo").write_text(cpuinfo)
    return tmp_path


def test_busy_and_stolen_shares_come_from_the_ticks_between_start_and_end(
    tmp_path: Path,
) -> None:
    proc = _proc(tmp_path, "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
    start = cpu_times(proc)
    assert start == (100, 0, 50, 800, 50, 0, 0, 0)
    # 1,000 ticks later: 600 user, 100 system, 200 idle, 100 stolen
    (proc / "stat").write_text("cpu  700 0 150 1000 50 0 0 100 0 0\n")
    got = describe(start, cpu_times(proc), proc=proc)
    assert got["cpu_busy_fraction"] == 0.8
    assert got["cpu_steal_fraction"] == 0.1
    assert got["cpu"] == "AMD EPYC (family 25, model 17)"
    # the reported features, in FEATURES' order, of the first processor only
    assert got["cpu_features"] == ["aes", "pclmulqdq", "avx2", "avx512f", "vaes"]
    assert got["hypervisor"] is True
    assert got["logical_cpus"] >= 1


@pytest.mark.parametrize("stat", ["", "intr 1 2 3\n", "cpu 1 2 3\n"])
def test_an_unreadable_stat_gives_no_shares(tmp_path: Path, stat: str) -> None:
    proc = _proc(tmp_path, stat, cpuinfo="")
    assert cpu_times(proc) is None
    got = describe(None, cpu_times(proc), proc=proc)
    assert got["cpu_busy_fraction"] is None and got["cpu_steal_fraction"] is None
    assert got["cpu"] is None and got["cpu_features"] == [] and got["hypervisor"] is False


def test_no_proc_at_all(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    assert cpu_times(missing) is None
    assert describe(None, None, proc=missing)["cpu"] is None


def test_every_finished_result_says_where_it_ran(capsys: pytest.CaptureFixture[str]) -> None:
    def run(args: argparse.Namespace) -> dict[str, object]:
        return {"bench": "x", "engine": "python"}

    assert finish("x", run, lambda r: "table", argparse.Namespace(json=True),
                  errors=RuntimeError, cleaned_up="nothing") == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    machine = result["machine"]
    assert set(machine) >= {"cpu", "logical_cpus", "kernel", "cpu_busy_fraction"}
    assert machine["kernel"]  # (this machine's release, never empty)


@pytest.mark.skipif(not auth.ACCELERATED, reason="built without libcrypto's headers")
def test_openssl_names_the_libcrypto_loaded_into_the_process(tmp_path: Path) -> None:
    # the library the C code seals with, as that library reports itself at run time
    # (a libcrypto.so.3 of another version put first on the loader's path shows there)
    maps = Path("/proc/self/maps").read_text().split("\n")
    loaded_paths = {line.split()[-1] for line in maps if "/libcrypto" in line}
    assert len(loaded_paths) == 1, loaded_paths
    libcrypto = ctypes.CDLL(loaded_paths.pop())  # (the one already loaded)
    libcrypto.OpenSSL_version.restype = ctypes.c_char_p
    loaded = libcrypto.OpenSSL_version(0).decode()  # OPENSSL_VERSION
    assert loaded == auth.LIBCRYPTO_VERSION
    assert describe(None, None, proc=_proc(tmp_path, "cpu 1 1 1 1 1 0 0 0\n"))["openssl"] == loaded
