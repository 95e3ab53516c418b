"""The testbed's lifecycle helpers that need no root: signals ignored during a
cleanup, the per-prefix lock, interface and nftables table names."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from dlcp.testbed import netns
from dlcp.testbed.impairments import _loss_table
from dlcp.testbed.netns import NetnsError, _ifname, prefix_lock

from dlcp.launch import signals_ignored


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

    def fake_run(argv: list[str], *, check: bool = True) -> None:
        deleted.append(argv[-1])
        if len(deleted) == 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(netns, "_run", fake_run)
    netns._cleanup(["n1", "n2", "n3", "n4"])
    assert deleted == ["n1", "n2", "n3", "n4"]


def test_prefix_lock_refuses_a_second_live_testbed() -> None:
    prefix = f"locktest{os.getpid()}-"
    refused = rf"prefix '{prefix}' is in use .*pid {os.getpid()}"
    with prefix_lock(prefix), pytest.raises(NetnsError, match=refused), prefix_lock(prefix):
        pass  # pragma: no cover - refused
    with prefix_lock(prefix):  # free again once the first one ended
        pass


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
