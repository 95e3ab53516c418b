"""The order of one I/O turn's input (``IOLoop._take_input``, an ``Endpoint``'s):
the data socket first even when ``select`` did not report it, and no control message nor timer
while the data socket keeps a backlog younger than ``_BACKLOG_HOLD``. A FINISH or
a reorder grace judged before queued data is read makes the receiver NACK (or
complete by the bound) data that has arrived: on 4 ranks sharing 2 cores that
cost hundreds of needless retransmissions per DDP iteration. A backlog that lasts
(a flood) holds nothing back: hellos must be read and timers run. Fakes stand in
for the session and sockets."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from dlcp.io import io_loop
from dlcp.io.endpoint import Endpoint


class _Turn:
    def __init__(self, backlog: bool) -> None:
        self.log: list[str] = []
        self.lingers: list[bool] = []  # may_linger of each data read
        ep: Any = Endpoint.__new__(Endpoint)  # no sockets, no thread: only the turn's logic
        ep._data = SimpleNamespace(recv_sock="data-socket", backlog=backlog)
        ep._session = SimpleNamespace(handle_timer=self._timer)
        ep._receive_data = self._receive_data
        ep._on_ready = lambda sel, sock, what: self.log.append(what)
        ep._control_turn = time.monotonic()  # control and timers just had their turn
        ep._junk_read = False
        self.endpoint = ep

    def _receive_data(self, start: float, timer: float | None, *, may_linger: bool) -> None:
        self.log.append("data")
        self.lingers.append(may_linger)

    def _timer(self, *, now: float, data_pending: bool = False) -> None:
        self.log.append("timer, data pending" if data_pending else "timer")

    def run(self, ready_kinds: list[str], timer: float | None) -> list[str]:
        ready = [(SimpleNamespace(fileobj=f"{k}-socket", data=k), 1) for k in ready_kinds]
        self.endpoint._take_input(None, ready, timer, time.monotonic())
        return self.log


@pytest.mark.parametrize("ready", [["control", "wake"], ["wake", "control", "data"], []])
def test_data_is_read_first_then_control_then_the_due_timer(ready: list[str]) -> None:
    log = _Turn(backlog=False).run(ready, timer=0.0)
    assert log == ["data", *[k for k in ready if k != "data"], "timer"]


@pytest.mark.parametrize(
    ("ready", "may_linger"),
    [([], True), (["data"], True), (["control"], False), (["data", "wake"], False)],
)
def test_the_data_read_lingers_only_when_no_other_file_is_ready(
    ready: list[str], may_linger: bool
) -> None:
    # (another ready file ends the receive loop's linger at once: two system calls
    # that would change nothing)
    turn = _Turn(backlog=False)
    turn.run(ready, timer=None)
    assert turn.lingers == [may_linger]


def test_a_timer_not_yet_due_does_not_run() -> None:
    assert _Turn(backlog=False).run(["control"], timer=float("inf")) == ["data", "control"]


def test_a_data_backlog_holds_back_control_and_timers() -> None:
    log = _Turn(backlog=True).run(["control", "wake", "accept"], timer=0.0)
    assert log == ["data", "wake", "accept"]


def test_a_lasting_backlog_holds_control_and_timers_back_for_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(io_loop.time, "monotonic", lambda: clock[0])
    turn = _Turn(backlog=False)
    assert turn.run(["control"], timer=0.0) == ["data", "control", "timer"]
    turn.endpoint._data.backlog = True  # a backlog, then one that lasts
    hold = io_loop._BACKLOG_HOLD
    for _ in range(3):
        clock[0] += hold / 4
        assert turn.run(["control"], timer=0.0)[-1] == "data"
    clock[0] += hold / 2  # their turn comes, backlog or not; the receive side is told
    # the backlog is still unread (it must not NACK what may be in it)
    assert turn.run(["control"], timer=0.0)[-3:] == ["data", "control", "timer, data pending"]
    clock[0] += hold / 4
    assert turn.run(["control"], timer=0.0)[-2:] == ["timer, data pending", "data"]  # held again
    turn.endpoint._data.backlog = False  # drained: nothing held
    assert turn.run(["control"], timer=0.0)[-3:] == ["data", "control", "timer"]


def test_a_backlog_with_junk_in_it_holds_nothing_back() -> None:
    turn = _Turn(backlog=True)
    turn.endpoint._junk_read = True  # the pre-filter dropped some of what was read
    assert turn.run(["control"], timer=0.0) == ["data", "control", "timer"]


class _Control:
    """Inbound connections by their accept time and whether they said hello."""

    def __init__(self, opened: dict[str, float]) -> None:
        self.opened = dict(opened)
        self.dropped: list[str] = []

    def silent_since(self, before: float) -> list[str]:
        return [sock for sock, at in self.opened.items() if at < before]

    def drop(self, sock: str, why: str) -> None:
        del self.opened[sock]
        self.dropped.append(sock)

    def hello_waits(self) -> float | None:
        return min(self.opened.values(), default=None)


def test_tending_drops_silent_connections_once_due_and_sets_the_next_due_time() -> None:
    ep: Any = Endpoint.__new__(Endpoint)
    ep.config = SimpleNamespace(timeout=10.0)
    ep._control = _Control({"early": 0.0, "late": 4.0})
    ep._accept_resume = None
    ep._hello_due = 10.0  # (the accept of "early" set it)
    sel = SimpleNamespace(unregister=lambda sock: None)
    ep._tend_listener(sel, 9.0)  # not due: nothing looked at
    assert ep._control.dropped == [] and ep._hello_due == 10.0
    ep._tend_listener(sel, 10.5)
    assert ep._control.dropped == ["early"] and ep._hello_due == 14.0
    ep._control.opened.clear()  # ("late" said hello)
    ep._tend_listener(sel, 14.5)
    assert ep._control.dropped == ["early"] and ep._hello_due == float("inf")


def test_the_wait_ends_at_the_earliest_of_timer_pause_and_deadline() -> None:
    ep: Any = Endpoint.__new__(Endpoint)
    ep._accept_resume = None
    ep._sender = None
    ep._transfers = SimpleNamespace(earliest=float("inf"))
    assert ep._next_time(100.0, None) == 101.0  # (a second at most)
    assert ep._next_time(100.0, 100.5) == 100.5
    ep._transfers.earliest = 100.2
    assert ep._next_time(100.0, 100.5) == 100.2
    ep._accept_resume = 100.1
    assert ep._next_time(100.0, 100.5) == 100.1
    # a round whose report may come without a wake-up: the earliest its FINISH
    # timer can be due (the engine's rule 9)
    ep._session = SimpleNamespace(config=SimpleNamespace(finish_timeout=0.05))
    ep._sender = SimpleNamespace(quiet_due=lambda timeout: 100.0 + timeout)
    assert ep._next_time(100.0, 100.5) == 100.05
    ep._sender.quiet_due = lambda timeout: None  # (none under way)
    assert ep._next_time(100.0, 100.5) == 100.1
