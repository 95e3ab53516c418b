"""ns-3 runs on a small leaf-spine (skipped without the ``sim`` extra).

All runs happen once per module, two at a time, each forked from the runner's
fork server (ns-3 keeps global state, and loading it takes ~20 s), and the
tests read them. One config runs a second time, as ``python -m dlcp.sim.engine``
in a fresh interpreter started beside the fork server: a forked run must give
what a fresh one gives.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ns3", reason="ns-3 not installed: pip install 'dlcp[sim]'")
pytest.importorskip("cppyy", reason="ns-3 not installed: pip install 'dlcp[sim]'")

from dlcp.sim import SimConfig, run_many
from dlcp.sim.runner import run_name
from tests.process_helpers import alive

# 16 hosts on 2 leaves, 2 servers: an incast of 14 workers (1 MB each) per iteration
INCAST = {"hosts": 16, "hosts_per_leaf": 8, "spines": 2, "servers": 2, "iterations": 1,
          "buffer_packets": 100, "workload": "ps-resnet50", "scale": 0.01}  # fmt: skip
# ring all-reduce on 8 hosts: one flow per link, nothing should be lost
RING = {"hosts": 8, "hosts_per_leaf": 4, "spines": 2, "iterations": 1,
        "workload": "ring-resnet50", "scale": 0.01}  # fmt: skip
# one server, unpaced senders, VGG-16's 411 MB layer as one 4 MB message per
# worker: drops scattered enough that NACKs need several parts (> 170 ranges)
OVERLOAD = {"hosts": 16, "hosts_per_leaf": 8, "spines": 2, "servers": 1, "iterations": 1,
            "workload": "ps-vgg16", "scale": 0.01, "partition_bytes": 1 << 30,
            "protocol": {"pacer": "unpaced"}}  # fmt: skip
TRANSPORTS = ("dlcp", "tcp", "dctcp")
INCAST_P = SimConfig().p  # DLCP's default gradient loss bound


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sim")
    configs = [SimConfig(**INCAST, transport=t) for t in TRANSPORTS]
    configs += [SimConfig(**RING, transport=t) for t in TRANSPORTS]
    configs.append(SimConfig(**RING, transport="dlcp", protocol={"pacer": "unpaced"}))
    configs.append(SimConfig(**OVERLOAD, transport="dlcp"))
    fresh = out / "fresh"
    fresh.mkdir()
    name = run_name(configs[0])
    conf, result, flows = (fresh / f"{name}{ext}" for ext in (".config.json", ".json", ".csv"))
    conf.write_text(json.dumps(configs[0].to_dict()))
    with (fresh / "log").open("wb") as log:
        engine = subprocess.Popen(
            [sys.executable, "-m", "dlcp.sim.engine", str(conf), str(result), str(flows)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        rows = run_many(configs, out / "a", jobs=2)
        engine.wait(timeout=600)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    assert engine.returncode == 0, (fresh / "log").read_text()[-3000:]
    return {
        "incast": {r["transport"]: r for r in rows[:3]},
        "ring": {r["transport"]: r for r in rows[3:6]},
        "ring_unpaced": rows[6],
        "overload": rows[7],
        "fresh": (json.loads(result.read_text()), flows),
        "dir": out / "a",
    }


@pytest.mark.parametrize("workload", ["incast", "ring"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_transport_completes(runs: dict[str, Any], workload: str, transport: str) -> None:
    r = runs[workload][transport]
    assert r["completed"] == r["messages"] > 0
    assert r["failed"] == 0
    assert r["iteration_mean_us"] > 0
    assert not r.get("tcp_stuck")  # no TCP connection left with undelivered data


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_no_congestion_delivers_everything(runs: dict[str, Any], transport: str) -> None:
    r = runs["ring"][transport]
    assert r["lost_bytes_total"] == 0
    assert r["switch_drops"] == 0


def test_incast_dlcp_loss_within_bound_and_tail_below_tcp(runs: dict[str, Any]) -> None:
    dlcp, tcp = runs["incast"]["dlcp"], runs["incast"]["tcp"]
    assert dlcp["switch_drops"] > 0  # the incast really congests
    assert dlcp["drops_protected"] <= dlcp["drops_drop_eligible"]
    assert dlcp["loss_fraction_max_message"] <= INCAST_P + 1e-9
    assert 0 <= dlcp["loss_fraction"] <= INCAST_P
    assert dlcp["fct_p99_us"] < tcp["fct_p99_us"]


def test_a_forked_run_is_a_fresh_interpreters_run(runs: dict[str, Any]) -> None:
    """The same seed gives the same flows: the run forked from the fork server
    and the one in a fresh interpreter (the simulation is deterministic, and
    the fork server's state is that of a fresh interpreter)."""
    forked = runs["incast"]["dlcp"]
    fresh, fresh_flows = runs["fresh"]

    def rows(path: Path) -> list[dict[str, str]]:
        with path.open() as f:
            return list(csv.DictReader(f))

    assert rows(runs["dir"] / f"{forked['name']}.flows.csv") == rows(fresh_flows)
    assert len(rows(fresh_flows)) == fresh["flows"] > 0
    for counter in ("completed", "switch_drops", "data_packets", "control_packets"):
        assert fresh[counter] == forked[counter], counter


def test_dctcp_marks_at_k_and_drops_less_than_tcp(runs: dict[str, Any]) -> None:
    """DCTCP's switches mark every ECT packet that finds K or more queued (RFC
    8257): under the incast marks outnumber drops and DCTCP drops less than TCP.
    (With ns-3's RED defaults, as the model had them before `a648f68`: 37 marks, 550 drops against
    TCP's 494.)"""
    dctcp, tcp = runs["incast"]["dctcp"], runs["incast"]["tcp"]
    assert dctcp["ecn_marks"] > 2 * dctcp["switch_drops"] > 0
    assert dctcp["switch_drops"] < tcp["switch_drops"]


def test_tcp_retransmissions_are_not_claimed_as_zero(runs: dict[str, Any]) -> None:
    assert runs["incast"]["tcp"]["retransmitted_packets"] is None  # not counted
    assert runs["incast"]["dlcp"]["retransmitted_packets"] > 0


def test_an_unpaced_sender_sends_at_line_rate(runs: dict[str, Any]) -> None:
    """Unpaced, nothing raises a pair's rate: it must start at the host's line
    rate, not the paced start of 10 Gbit/s (it stayed there: 62 us mean FCT)."""
    unpaced, paced = runs["ring_unpaced"], runs["ring"]["dlcp"]
    assert unpaced["completed"] == unpaced["messages"] > 0
    assert unpaced["fct_mean_us"] < paced["fct_mean_us"]


def test_a_nack_in_several_parts_is_gathered_before_acting(runs: dict[str, Any]) -> None:
    """A NACK over more ranges than one control packet holds comes in parts; the
    sender acts once on all of them (as dlcp.proto's outbox does), and every
    message still ends: completed within its bound, or failed and counted."""
    r = runs["overload"]
    assert r["multi_part_nacks"] > 0  # the overload really produced split NACKs
    assert r["max_rounds"] >= 2
    assert r["completed"] + r["failed"] == r["messages"] > 0


def _gone(*pids: int, within: float) -> bool:
    """Whether every one of ``pids`` has exited (or is a zombie) within ``within`` s."""
    deadline = time.monotonic() + within
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # (polling the kernel's process table for their exits)
    return not any(alive(pid) for pid in pids)


def test_a_runner_killed_by_a_signal_takes_its_fork_server_with_it(tmp_path: Path) -> None:
    """SIGKILL runs no ``finally``: the fork server must die with its runner
    (runs used to simulate on, for minutes of CPU). Killed while the server
    still loads ns-3 (~20 s), so that only its parent-death signal can end it
    within the few seconds allowed."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dlcp.sim.runner import _ForkServer\n"
        "_ForkServer(Path(sys.argv[1]) / 'fork-server.log')\n"
    )
    runner = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)])
    try:
        children = Path(f"/proc/{runner.pid}/task/{runner.pid}/children")
        deadline = time.monotonic() + 60
        while not children.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)  # (polling the kernel's process table for the server)
        (server,) = (int(pid) for pid in children.read_text().split())
        runner.kill()
        runner.wait(timeout=10)
        assert _gone(server, within=5.0)
        assert "ready" not in (tmp_path / "fork-server.log").read_text()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()


def test_a_run_dies_with_its_fork_server_and_the_runner_says_so(tmp_path: Path) -> None:
    """A fork server (one thread: it forks) killed by SIGKILL (no ``finally``
    of its own kills its runs) takes its runs with it, and the runner stops with
    an error that names the server. Before that, a run that fails (its config file is missing) ends
    with its own exit code and its traceback in its log, and the server forks
    the next run."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dlcp.sim.config import SimConfig\n"
        "from dlcp.sim.runner import _ForkServer, _start\n"
        "out = Path(sys.argv[1])\n"
        "server = _ForkServer(out / 'fork-server.log')\n"
        "ends = ('.config.json', '.result.json', '.flows.csv', '.log')\n"
        "print(server.start(7, tuple(out / f'missing{end}' for end in ends)), flush=True)\n"
        "print(*server.next_exit(), flush=True)\n"
        "job = _start(server, 8, SimConfig(), out)\n"
        "print(server.proc.pid, job.pid, flush=True)\n"
        "server.next_exit()\n"
    )
    runner = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert runner.stdout is not None
        runner.stdout.readline()  # (the failing run's pid)
        assert runner.stdout.readline().split() == ["7", "1"]  # its id and exit code
        log = (tmp_path / "missing.log").read_text()
        assert "FileNotFoundError" in log and "missing.config.json" in log, log[-2000:]
        server, run = (int(pid) for pid in runner.stdout.readline().split())
        assert alive(server) and alive(run)  # (the default run simulates for many seconds)
        assert len(os.listdir(f"/proc/{server}/task")) == 1  # it forks with one thread
        os.kill(server, signal.SIGKILL)
        assert _gone(run, within=10.0)
        _, err = runner.communicate(timeout=30)
        assert runner.returncode == 1
        assert "SimError: the ns-3 fork server stopped (exit -9)" in err, err[-2000:]
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
