"""The testbed's lifecycle helpers that need no root: signals ignored during a
cleanup, the per-prefix lock, interface and nftables table names."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest

from dlcp.processes import signals_ignored
from testbed import netns
from testbed.impairments import _loss_table
from testbed.netns import NetnsError, _ifname, prefix_lock


def test_a_signal_during_a_cleanup_is_ignored() -> None:
    done = []
    before = signal.getsignal(signal.SIGINT)
    # another thread that could take the signal (a blocked mask in this one would not
    # stop it there: this is why the cleanup ignores signals rather than block them)
    other_ends = threading.Event()
    other = threading.Thread(target=other_ends.wait)
    other.start()
    try:
        with signals_ignored():
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C, mid-cleanup
            done.append("the rest of the cleanup")
    finally:
        other_ends.set()
        other.join()
    assert done == ["the rest of the cleanup"]
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C works again after it


def test_cleanup_deletes_every_name_despite_a_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    deleted: list[str] = []

    def fake_run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        if argv[:3] == ["ip", "netns", "del"]:
            deleted.append(argv[-1])
            if len(deleted) == 2:
                os.kill(os.getpid(), signal.SIGINT)
        return subprocess.CompletedProcess(argv, 0, "", "")  # (no processes in it)

    monkeypatch.setattr(netns, "_run", fake_run)
    netns._cleanup(["n1", "n2", "n3", "n4"])
    assert deleted == ["n1", "n2", "n3", "n4"]


def test_prefix_lock_refuses_a_second_live_testbed() -> None:
    prefix = f"locktest{os.getpid()}-"
    refused = rf"prefix '{prefix}' is in use .*pid {os.getpid()}"
    with prefix_lock(prefix), pytest.raises(NetnsError, match=refused), prefix_lock(prefix):
        pass  # pragma: no cover - refused
    with prefix_lock(prefix):  # free again once the first one ended
        path = os.path.join(netns._lock_dir(), f"dlcp-testbed-{prefix}.lock")
        assert os.path.exists(path)
    assert not os.path.exists(path)  # removed with the lock (they piled up, one per run)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root and ip")
def test_cleanup_stops_what_still_runs_in_a_namespace() -> None:
    """A process left in a crashed run's namespace (a BMv2 switch) kept the
    namespace, its veths and routes alive after ``ip netns del`` took the name."""
    name = f"dlcptest{os.getpid()}-"
    subprocess.run(["ip", "netns", "add", name], check=True)
    left = None
    try:
        left = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c",
             "import signal; print('ready', flush=True); signal.pause()"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert left.stdout is not None and left.stdout.readline().strip() == "ready"
        netns._cleanup([name])
        assert left.wait(timeout=10) == -signal.SIGKILL
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert name not in listed.split()
    finally:
        if left is not None and left.poll() is None:  # (the cleanup failed to stop it)
            left.kill()
            left.wait()
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_interface_names_of_one_run_stay_distinct_when_cut_to_15() -> None:
    long_prefix = "dlcp1234567-10"  # a 7-digit pid, tenth run
    names = {_ifname(long_prefix, s) for s in ("va", "vb", "ra", "rb")}
    assert len(names) == 4, names
    assert all(len(n) <= 15 for n in names), names
    assert _ifname("dlcp12-3", "ra") == "dlcp12-3ra"


def test_loss_tables_of_look_alike_devices_differ() -> None:
    assert _loss_table("s-1") != _loss_table("s_1")
    assert _loss_table("s_1") != _loss_table("s__1") != _loss_table("s-1")
    assert _loss_table("spine1") == "dlcp_loss_spine1"


def test_ignored_signals_come_back_when_setting_one_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = signal.getsignal(signal.SIGINT)
    real = signal.signal

    def failing(signum: int, handler: object) -> object:
        if signum == signal.SIGTERM and handler == signal.SIG_IGN:
            raise RuntimeError("a signal arrived right here")
        return real(signum, handler)  # type: ignore[arg-type]

    monkeypatch.setattr(signal, "signal", failing)
    with pytest.raises(RuntimeError), signals_ignored():
        pass  # pragma: no cover - not reached
    assert signal.getsignal(signal.SIGINT) is before
