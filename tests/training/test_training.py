"""Training over the DLCP DDP hook on 4 local ranks, and the ``dlcp launch`` launcher.

* p = 0, no loss: the hook's gradients equal Gloo's all-reduce (ring and PS);
* emulated loss, p = 0.05: replicas stay bit-identical after every step and the
  digits accuracy after a fixed budget is within 1.5 points of the lossless run;
* a rank dies mid-training: the others fail with a DLCP error naming it, quickly;
* ``dlcp launch`` passes a failing rank's exit code on and stops the others.

Every rank is a real process (4 ranks on 2 cores: most of a test's time is the
ranks importing torch and DDP). Every wait is bounded, and every process a test
starts is stopped by its handle in a ``finally``.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dlcp.launch import LaunchResult, free_port, launch, rank_env
from tests.process_helpers import alive

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_digits.py"
WORLD = 4


def _env(**extra: str) -> dict[str, str]:
    """This environment without DLCP_* settings of the caller, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLCP_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _launch(
    cmd: list[str], env: dict[str, str], timeout: float, nproc: int = 0
) -> tuple[LaunchResult, str, str]:
    out, err = io.StringIO(), io.StringIO()
    result = launch(cmd, nproc or WORLD, env=env, stdout=out, stderr=err, timeout=timeout)
    return result, out.getvalue(), err.getvalue()


def _explain(result: LaunchResult, out: str, err: str) -> str:
    return f"{result.message}\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-6000:]}"


# ---------------------------------------------------------------------------- gradients


@pytest.mark.slow
def test_hook_gradients_equal_gloo_allreduce_ring_direct_and_ps() -> None:
    """tests/training/ddp_worker.py: a conv/linear/layer-norm model (11
    parameter tensors) under DDP over Gloo, with the DLCP hook over a ring, in
    one round (direct), by halving-doubling, and over a PS, and with the TCP parameter-server
    baseline hook (server rank 1); assert_close of every gradient, 4 iterations."""
    cmd = [sys.executable, "-u", "-m", "tests.training.ddp_worker"]
    result, out, err = _launch(cmd, _env(DLCP_TIMEOUT="20"), timeout=150)
    assert result.returncode == 0, _explain(result, out, err)
    line = next(x for x in out.splitlines() if "RESULT " in x)
    summary = json.loads(line.split("RESULT ", 1)[1])
    for name in ("ring", "direct", "halving", "ps"):
        assert summary[name]["steps"] == 4
        assert summary[name]["lost_elems"] == 0
        # DDP rebuilt its buckets after the first iteration: more than one now
        assert summary[name]["buckets"][-1] > 1
    # small exact buckets go in one round unless the state says otherwise
    assert summary["direct"]["ops"] == ["direct_allreduce"]
    assert summary["ring"]["ops"] == ["ring_allreduce"]
    assert summary["ps"]["ops"] == ["ps_allreduce"]
    assert summary["halving"]["ops"] == ["halving_doubling_allreduce"]


def test_the_tcp_parameter_server_hook_returns_before_its_exchange() -> None:
    """tests/training/tcp_ps_worker.py: the TCP baseline's hook hands the
    bucket to its thread as DLCP's does (rank 0's future is not done when the
    hook returns: rank 1 has not even called its hook yet); both ranks get the
    average in their own buffer, of a bucket moved in pieces too; a closed state
    refuses the next bucket."""
    cmd = [sys.executable, "-u", "-m", "tests.training.tcp_ps_worker"]
    result, out, err = _launch(cmd, _env(), timeout=120, nproc=2)
    assert result.returncode == 0, _explain(result, out, err)
    rows = [json.loads(x.split("RESULT ", 1)[1]) for x in out.splitlines() if "RESULT " in x]
    assert sorted(r["rank"] for r in rows) == [0, 1], out
    by_rank = {r["rank"]: r for r in rows}
    assert by_rank[0]["done_at_return"] is False
    for r in rows:
        assert r["mean_ok"] and r["same_buffer"] and r["refused_after_close"], r
        assert r["pieces_ok"], r


# ---------------------------------------------------------------------------- loss


def _train(tmp: Path, name: str, env: dict[str, str], *args: str) -> dict[str, object]:
    path = tmp / f"{name}.json"
    cmd = [sys.executable, "-u", str(EXAMPLE), "--epochs", "6", "--json", str(path), *args]
    result, out, err = _launch(cmd, env, timeout=180)
    assert result.returncode == 0, _explain(result, out, err)
    data: dict[str, object] = json.loads(path.read_text())
    return data


@pytest.fixture(scope="module")
def gloo_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The lossless reference the lossy runs are held to: one Gloo run of the
    same seed, shared by them."""
    return _train(tmp_path_factory.mktemp("gloo"), "gloo", _env(), "--transport", "gloo")


@pytest.mark.slow
@pytest.mark.parametrize("collective", ["ring", "halving-doubling", "ps"])
def test_lossy_training_keeps_replicas_identical_and_accuracy(
    tmp_path: Path, collective: str, gloo_reference: dict[str, object]
) -> None:
    """2 % EMULATED loss of received data datagrams (each rank its own drop
    seed), p = 0.05 for the reduce-scatter (ring) or the push (parameter server,
    every rank serving a shard), a reliable all-gather or pull.
    ``--check-replicas`` compares a hash of every rank's parameters after every
    one of the 6 x 22 steps (the run stops on the first mismatch).

    Measured here (seed 0, 6 epochs, batch 16 per rank, 2-core VM):
    lossless reference (Gloo) 96.9 % test accuracy; DLCP under 2 % loss, ring:
    96.7 %, with 0.84-1.07 % of gradient elements lost (zero-filled) and ~200
    packets retransmitted per epoch; halving-doubling: 96.9 %, 0.90-1.24 % lost,
    ~190 retransmitted per epoch; PS: 96.7 %, 0.90-1.09 % lost, ~200
    retransmitted per epoch. (DLCP with p = 0 and no loss: 96.9 %, like Gloo.)
    """
    lossy = _train(
        tmp_path, "dlcp", _env(DLCP_EMULATED_LOSS="0.02"),
        "--transport", "dlcp", "--collective", collective, "--p", "0.05", "--check-replicas",
        *(["--ps-servers", "all"] if collective == "ps" else []),
    )
    epochs = lossy["epochs"]
    assert isinstance(epochs, list)
    steps = sum(e["iterations"] for e in epochs)
    assert lossy["replica_checks"] == steps > 100
    for e in epochs:
        assert 0.0 < e["loss_fraction"] <= 0.05, e  # the loss bit, within the bound
        assert e["retransmitted_packets"] > 0, e
    counters = lossy["endpoint_counters"]  # (each rank's, gathered at the end)
    assert isinstance(counters, list) and len(counters) == 4, counters
    assert all(c["datagrams_in"] > 0 and c["packets_out"] > 0 for c in counters), counters
    assert "endpoint_counters" not in gloo_reference
    ref_acc, acc = gloo_reference["final_test_accuracy"], lossy["final_test_accuracy"]
    assert isinstance(ref_acc, float) and isinstance(acc, float)
    assert ref_acc > 90.0, gloo_reference
    assert abs(acc - ref_acc) <= 1.5, (acc, ref_acc)


# ---------------------------------------------------------------------------- failure


@pytest.mark.slow
def test_rank_failure_fails_the_other_ranks_quickly(tmp_path: Path) -> None:
    """Rank 1 calls ``os._exit(3)`` at step 5 (``--exit-rank``). Ranks 0 and 2,
    its ring neighbours, fail with ``TransferFailed`` naming rank 1 (its control
    connection closed); rank 3 fails the same way when its neighbours go. All
    within 20 s of rank 1's exit (DLCP_TIMEOUT = 5 s bounds a silent peer)."""
    env = _env(DLCP_TIMEOUT="5")
    port = free_port()
    cmd = [sys.executable, "-u", str(EXAMPLE), "--epochs", "2",
           "--exit-rank", "1", "--exit-step", "5"]
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for rank in range(WORLD):
            log = open(tmp_path / f"rank{rank}.err", "w+b")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen(cmd, env=rank_env(rank, WORLD, port, env),
                                          stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=log))
        # (startup and five steps: minutes on a machine loaded five times over;
        # what is timed is the others' failure after rank 1's exit)
        assert procs[1].wait(timeout=300) == 3
        died = time.monotonic()
        codes = {r: procs[r].wait(timeout=max(1.0, died + 20 - time.monotonic()))
                 for r in (0, 2, 3)}
        elapsed = time.monotonic() - died
        stderr = {r: (tmp_path / f"rank{r}.err").read_text() for r in range(WORLD)}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    assert elapsed < 20
    for rank, code in codes.items():
        assert code != 0, stderr[rank]
        assert re.search(rf"(TransferFailed|PeerTimeout): rank {rank}: ", stderr[rank]), (
            stderr[rank][-3000:]
        )
    for rank in (0, 2):
        assert re.search(r"(TransferFailed|PeerTimeout): .*rank 1\b", stderr[rank]), (
            stderr[rank][-3000:]
        )


# ---------------------------------------------------------------------------- launcher


@pytest.fixture
def scripts(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "ok.py").write_text(
        "import os, sys\n"
        "print('hello', os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'],"
        " os.environ['LOCAL_WORLD_SIZE'], os.environ['MASTER_ADDR'])\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    (tmp_path / "fail.py").write_text(
        "import os, signal, sys\n"
        "if os.environ['RANK'] == '2':\n"
        "    print('rank 2 fails', file=sys.stderr)\n"
        "    sys.exit(7)\n"
        "signal.pause()\n"  # the others would run forever
    )
    (tmp_path / "wait.py").write_text(
        "import os, signal\n"
        "print('ready', os.getpid(), flush=True)\n"
        "signal.pause()\n"
    )
    (tmp_path / "wrapper.py").write_text(  # a rank that starts a process of its own
        "import os, pathlib, signal, subprocess, sys, threading\n"
        "child = subprocess.Popen([sys.executable, sys.argv[1]], stdout=subprocess.PIPE)\n"
        "pid = child.stdout.readline().split()[-1].decode()\n"
        "print('child', pid, flush=True)\n"
        "done = pathlib.Path(sys.argv[2])\n"
        "(done / os.environ['RANK']).write_text(pid)\n"
        "if os.environ['RANK'] == '2':  # once every rank has its child: exit, leaving\n"
        "    while len(list(done.iterdir())) < int(os.environ['WORLD_SIZE']):  # its own\n"
        "        threading.Event().wait(0.01)\n"
        "    sys.exit(7)\n"
        "signal.pause()\n"
    )
    (tmp_path / "stubborn.py").write_text(  # takes its time over SIGTERM
        "import os, pathlib, signal, sys, threading\n"
        "stop = threading.Event()\n"
        "signal.signal(signal.SIGTERM, lambda *a: stop.set())\n"
        "print('ready', os.getpid(), flush=True)\n"
        "stop.wait()\n"
        "(pathlib.Path(sys.argv[1]) / str(os.getpid())).touch()  # got it\n"
        "threading.Event().wait(1.0)  # cleaning up\n"
    )
    yield tmp_path


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "no-pidfd"])
def test_launch_stops_what_the_ranks_started(
    scripts: Path, monkeypatch: pytest.MonkeyPatch, pidfds: bool
) -> None:
    """A rank's own children (a wrapper's python, a data loader's workers) are
    stopped with it: each rank runs in its own process group, which the launcher
    terminates, whether the rank was stopped or exited on its own. Also where
    the kernel cannot signal a group through a pidfd (before 6.9): by pid while
    the group has members."""
    import dlcp.launch as launcher

    if not pidfds:
        monkeypatch.setattr(launcher, "hold_group", lambda proc: None)
    (scripts / "started").mkdir()
    cmd = [sys.executable, str(scripts / "wrapper.py"), str(scripts / "wait.py"),
           str(scripts / "started")]  # fmt: skip
    result, out, err = _launch(cmd, _env(), timeout=30)
    assert result.returncode == 7 and result.failed_rank == 2, _explain(result, out, err)
    children = [int(line.split()[-1]) for line in out.splitlines() if " child " in line]
    assert len(children) == WORLD, out
    deadline = time.monotonic() + 10  # (killed; their reaper may take a moment)
    while any(alive(pid) for pid in children):
        assert time.monotonic() < deadline, [pid for pid in children if alive(pid)]
        threading.Event().wait(0.01)


def test_launch_never_signals_a_group_by_the_pid_of_a_reaped_rank(
    scripts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reaped rank's pid may already lead someone else's process group: the
    launcher reaches a rank's group through the pidfd it opened at the start,
    or by pid only while the rank is not reaped. Before, it sent SIGTERM and
    SIGKILL by pid to every rank's group after all of them had been reaped."""
    import dlcp.launch as launcher

    by_pid: list[tuple[int, int]] = []
    real_killpg = os.killpg

    def killpg(pgid: int, sig: int) -> None:
        by_pid.append((pgid, int(sig)))
        real_killpg(pgid, sig)

    monkeypatch.setattr(launcher.os, "killpg", killpg)
    result, out, err = _launch([sys.executable, str(scripts / "ok.py")], _env(), timeout=30)
    assert result.returncode == 0, _explain(result, out, err)
    assert by_pid == []


def test_launch_tells_its_caller_the_ranks_process_ids(tmp_path: Path) -> None:
    """``on_start`` gets every rank's pid, in rank order (the testbed reads their CPU
    time from /proc by these): each rank prints its own pid to compare."""
    (tmp_path / "pid.py").write_text("import os\nprint('pid', os.getpid())\n")
    told: list[list[int]] = []
    out = io.StringIO()
    result = launch(
        [sys.executable, str(tmp_path / "pid.py")], WORLD, env=_env(), stdout=out,
        stderr=io.StringIO(), timeout=30, on_start=lambda pids: told.append(list(pids)),
    )  # fmt: skip
    assert result.returncode == 0, result.message
    printed = dict(re.findall(r"^\[rank(\d)\]: pid (\d+)$", out.getvalue(), re.M))
    assert told == [[int(printed[str(r)]) for r in range(WORLD)]]


def test_launch_sets_torchrun_variables_and_prefixes_output(scripts: Path) -> None:
    result, out, err = _launch([sys.executable, str(scripts / "ok.py")], _env(), timeout=30)
    assert result.returncode == 0, _explain(result, out, err)
    assert sorted(out.splitlines()) == [
        f"[rank{r}]: hello {r} {r} 4 4 127.0.0.1" for r in range(WORLD)
    ]
    assert sorted(err.splitlines()) == [f"[rank{r}]: to stderr" for r in range(WORLD)]


def test_launch_propagates_a_failing_rank_exit_code(scripts: Path) -> None:
    started = time.monotonic()
    result, _, err = _launch([sys.executable, str(scripts / "fail.py")], _env(), timeout=30)
    assert time.monotonic() - started < 15
    assert result.returncode == 7
    assert result.failed_rank == 2
    assert "rank 2 exited with code 7" in result.message
    assert "[rank2]: rank 2 fails" in err
    # the others were terminated by their handles, not left running
    assert [result.exit_codes[r] for r in (0, 1, 3)] == [-signal.SIGTERM] * 3


def test_dlcp_launch_cli_exit_code_and_message(scripts: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dlcp.cli", "launch", "-n", "4", str(scripts / "fail.py")],
        env=_env(), capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 7, proc.stderr
    assert "dlcp launch: rank 2 exited with code 7; terminated ranks 0, 1, 3" in proc.stderr


def test_ranks_that_fail_on_their_own_are_not_called_terminated(tmp_path: Path) -> None:
    """Every rank fails at once (a script that is not there): a rank the reaper
    had not marked yet when the first failure came was reported as terminated,
    though it had exited by itself."""
    result, _, err = _launch([sys.executable, str(tmp_path / "missing.py")], _env(), timeout=30)
    assert result.returncode == 2, _explain(result, "", err)
    said = result.message.split("; terminated ", 1)
    terminated = [int(r) for r in said[1].split(" ", 1)[1].split(", ")] if len(said) > 1 else []
    for r, code in enumerate(result.exit_codes):
        assert (r in terminated) == (code in (-signal.SIGTERM, -signal.SIGKILL)), result
        if code == 2:
            assert f"rank {r} exited with code 2" in result.message, result.message


def test_dlcp_launch_output_into_a_closed_pipe(scripts: Path) -> None:
    """``dlcp launch ... | head -1``: the reader goes away; the launch still ends
    as the ranks do, without a BrokenPipeError traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlcp.cli", "launch", "-n", "2", str(scripts / "ok.py")],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the ranks print
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def _as_from_a_terminal() -> None:  # pragma: no cover - runs in the child
    """Ctrl-C and a hangup as a terminal delivers them: a test run started in
    the background of a shell without job control inherits SIGINT ignored, and
    one under ``nohup`` SIGHUP, and the launcher then keeps ignoring them (as it
    should: such a launcher must not die of either)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def test_dlcp_launch_interrupt_terminates_the_ranks(scripts: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlcp.cli", "launch", "-n", "3", str(scripts / "wait.py")],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_as_from_a_terminal,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        pids = []
        for line in proc.stdout:  # readiness: every rank said so
            pids.append(int(line.split()[-1]))
            if len(pids) == 3:
                break
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
        for pid in pids:  # reaped by the launcher: gone
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _launched(
    scripts: Path, script: str, n: int, *args: str, preexec: Callable[[], None] | None = None
) -> tuple[subprocess.Popen[str], list[int]]:
    """``dlcp launch -n n script args`` (started as from a terminal, or with
    ``preexec``), once every rank said it is ready: (process, rank pids)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlcp.cli", "launch", "-n", str(n), str(scripts / script), *args],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=preexec or _as_from_a_terminal,
    )  # fmt: skip
    assert proc.stdout is not None
    pids = []
    for line in proc.stdout:  # readiness: every rank said so
        pids.append(int(line.split()[-1]))
        if len(pids) == n:
            break
    return proc, pids


def _as_under_nohup() -> None:  # pragma: no cover - runs in the child
    _as_from_a_terminal()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_dlcp_launch_under_nohup_outlives_a_hangup(scripts: Path) -> None:
    proc, pids = _launched(scripts, "wait.py", 2, preexec=_as_under_nohup)
    try:
        proc.send_signal(signal.SIGHUP)  # the terminal closes: nohup ignores it
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2)  # (a bounded wait for something that must not happen)
        assert all(alive(pid) for pid in pids)
        proc.send_signal(signal.SIGINT)  # still stoppable
        assert proc.wait(timeout=20) == 130
        assert not [pid for pid in pids if alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dlcp_launch_hangup_terminates_the_ranks(scripts: Path) -> None:
    # a closed terminal (SIGHUP) stops the ranks as Ctrl-C does
    proc, pids = _launched(scripts, "wait.py", 2)
    try:
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=20) == 128 + signal.SIGHUP
        err = proc.stderr.read() if proc.stderr else ""
        assert "interrupted (SIGHUP): ranks terminated" in err, err
        assert not [pid for pid in pids if alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_interrupt_does_not_cut_the_stopping_short(scripts: Path) -> None:
    got = scripts / "got-sigterm"
    got.mkdir()
    proc, pids = _launched(scripts, "stubborn.py", 2, str(got))
    try:
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        while len(list(got.iterdir())) < len(pids):  # the ranks got SIGTERM, clean up ...
            assert time.monotonic() < deadline, "the ranks never got their SIGTERM"
            threading.Event().wait(0.01)
        proc.send_signal(signal.SIGINT)  # ... when the user presses Ctrl-C again
        assert proc.wait(timeout=20) == 130
        err = proc.stderr.read() if proc.stderr else ""
        assert "Traceback" not in err, err
        assert not [pid for pid in pids if alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
