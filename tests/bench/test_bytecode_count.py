"""``dlcp.bench.bytecode_count``: bytecodes per thread, counted only while on,
only in threads started after it was installed (and the installing thread's later
calls), not in skipped files."""

from __future__ import annotations

import dis
import sys
import threading

from dlcp.bench.bytecode_count import BytecodeCounter


def _straight(a: int) -> int:
    b = a + 1
    return b * 2


def _longer(a: int) -> int:
    b = a + 1
    c = b * 2
    d = c - a
    return d * b


def _count_calls(fn: object, calls: int) -> int:
    counter = BytecodeCounter()
    with counter:
        counter.on = True
        for _ in range(calls):
            fn(3)  # type: ignore[operator]
        counter.on = False
    return counter.by_thread().get(threading.current_thread().name, 0)


def test_counts_each_call_of_straight_line_code_the_same() -> None:
    one = _count_calls(_straight, 1)
    # every instruction but the frame's RESUME, if the interpreter does not report it
    n = len(list(dis.get_instructions(_straight)))
    assert one in (n - 1, n)
    assert _count_calls(_straight, 10) == 10 * one
    assert _count_calls(_longer, 1) > one


def test_counts_nothing_while_off_or_after_uninstall() -> None:
    counter = BytecodeCounter()
    with counter:
        _straight(1)
    counter.on = True
    _straight(1)  # (uninstalled: no hook on this frame)
    assert counter.by_thread() == {threading.current_thread().name: 0}


def test_uninstall_puts_back_the_hooks_it_replaced() -> None:
    calls: list[str] = []

    def earlier(frame: object, event: str, arg: object) -> None:
        calls.append(event)

    sys.settrace(earlier)
    threading.settrace(earlier)
    try:
        with BytecodeCounter():
            assert sys.gettrace() is not earlier
        assert sys.gettrace() is earlier and threading.gettrace() is earlier
    finally:
        sys.settrace(None)
        threading.settrace(None)


def test_threads_started_after_install_count_under_their_names() -> None:
    before = threading.Event()
    release = threading.Event()

    def early() -> None:
        before.set()
        release.wait()
        for _ in range(50):
            _straight(1)

    def late() -> None:
        for _ in range(7):
            _straight(1)

    early_thread = threading.Thread(target=early, name="early")
    early_thread.start()
    before.wait()
    counter = BytecodeCounter()
    with counter:
        counter.on = True
        late_thread = threading.Thread(target=late, name="late")
        late_thread.start()
        late_thread.join()
        release.set()
        early_thread.join()
        counter.on = False
    counts = counter.by_thread()
    assert "early" not in counts  # (started before the hook)
    assert counts["late"] >= 7 * _count_calls(_straight, 1)


def test_skipped_files_are_not_counted_but_what_they_call_is() -> None:
    per_call = _count_calls(_straight, 1)
    counter = BytecodeCounter(skip=(__file__,))
    with counter:
        counter.on = True
        for _ in range(5):
            dis.get_instructions(_straight)  # (a generator: its frame starts later)
            _straight(1)
        counter.on = False
    # _straight lives in this (skipped) file; get_instructions' frame does not
    counted = counter.by_thread()[threading.current_thread().name]
    assert counted > 0
    only_dis = BytecodeCounter(skip=(__file__,))
    with only_dis:
        only_dis.on = True
        for _ in range(5):
            dis.get_instructions(_straight)
        only_dis.on = False
    assert counted == only_dis.by_thread()[threading.current_thread().name]
    assert per_call > 0
