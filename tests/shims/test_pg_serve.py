"""The process group's transport threads (``shims/pg_serve.py``): items run one
at a time in queue order, and a completion may wait for a later item's."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from shims.pg_serve import KEPT, OrderedServers


def test_items_run_one_at_a_time_in_queue_order() -> None:
    ran: list[int] = []
    running = threading.Lock()

    def execute(item: int) -> Callable[[], None]:
        assert running.acquire(blocking=False), "two items ran at once"
        ran.append(item)
        running.release()
        return lambda: None

    servers: OrderedServers[int] = OrderedServers(execute, name="t", os_name="t")
    for i in range(200):
        servers.put(i)
    servers.stop()
    assert servers.join(10)
    assert ran == list(range(200))
    assert servers.threads == 0


def test_a_completion_may_wait_for_later_items_to_complete() -> None:
    """Item 0's completion waits for item 1's, whose completion waits for item
    2's: with one thread (or a fixed two) the chain waited for itself forever."""
    done = [threading.Event() for _ in range(3)]
    counts: list[int] = []

    def execute(item: int) -> Callable[[], None]:
        def complete() -> None:
            if item < 2:
                servers.put(item + 1)  # a callback that starts the next operation...
                assert done[item + 1].wait(10), f"item {item + 1} never completed"  # ...waits
            counts.append(servers.threads)
            done[item].set()

        return complete

    servers: OrderedServers[int] = OrderedServers(execute, name="t", os_name="t")
    servers.put(0)
    assert done[0].wait(10)
    assert max(counts) >= 3  # a thread was added for the nested wait
    servers.put(99)  # (threads beyond KEPT leave once their completions return)
    servers.stop()
    assert servers.join(10)


def test_a_failing_completion_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    completed: list[int] = []

    def execute(item: int) -> Callable[[], None]:
        def complete() -> None:
            if item == 1:
                raise ValueError("a callback failed")
            completed.append(item)

        return complete

    servers: OrderedServers[int] = OrderedServers(execute, name="srv", os_name="srv")
    for i in range(4):
        servers.put(i)
    servers.stop()
    assert servers.join(10)
    assert sorted(completed) == [0, 2, 3]
    assert "srv: completing an operation failed" in caplog.text


def test_an_operation_that_raises_does_not_end_the_thread_the_turn_waits_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """execute settles its own errors; one that raises anyway (a defect) is logged,
    and the thread goes on. Here it is the only thread free to take the turn: item
    0's completion waits for item 2 to run, and item 1's execute raises. Before, the
    error ended that thread, item 2 never ran and item 0's completion waited for
    ever."""
    two_ran = threading.Event()
    waited: list[bool] = []

    def execute(item: int) -> Callable[[], None]:
        if item == 1:
            raise RuntimeError("a defect in execute")
        if item == 2:
            two_ran.set()
        return lambda: waited.append(two_ran.wait(10)) if item == 0 else None

    servers: OrderedServers[int] = OrderedServers(execute, name="srv", os_name="srv")
    for i in range(3):
        servers.put(i)
    servers.stop()
    assert servers.join(15)
    assert waited == [True], "item 2 never ran: no thread took the turn after item 1's"
    assert "srv: running an operation failed" in caplog.text


def test_a_thread_that_cannot_be_started_leaves_the_next_item_to_the_one_that_tried(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """When every thread is in a completion the group starts another; if the
    system has none to give, the thread that asked completes its operation and
    then takes the next turn itself (before, the error ended it, its completion
    never ran and nothing ran the items after)."""
    real = threading.Thread

    class Refused(real):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    completed: list[int] = []
    servers: OrderedServers[int] = OrderedServers(
        lambda item: lambda: completed.append(item), name="srv", os_name="srv"
    )
    monkeypatch.setattr("shims.pg_serve.threading.Thread", Refused)  # (after the first)
    for i in range(3):
        servers.put(i)
    servers.stop()
    assert servers.join(10)
    assert completed == [0, 1, 2]
    assert "srv: no thread for the next operation" in caplog.text


def test_threads_beyond_the_kept_ones_leave() -> None:
    release = threading.Event()
    entered = threading.Semaphore(0)

    def execute(item: int) -> Callable[[], None]:
        def complete() -> None:
            entered.release()
            release.wait(10)

        return complete

    servers: OrderedServers[int] = OrderedServers(execute, name="t", os_name="t")
    for i in range(3):  # three completions held at once: four threads
        servers.put(i)
    for _ in range(3):
        assert entered.acquire(timeout=10)
    assert servers.threads == 4
    release.set()
    servers.put(3)  # passes through the kept threads
    entered.acquire(timeout=10)
    pause = threading.Event()  # (never set: a bounded poll of the thread count)
    for _ in range(100):
        if servers.threads == KEPT:
            break
        pause.wait(0.05)
    assert servers.threads == KEPT
    servers.stop()
    assert servers.join(10)


class _PausingLock:
    """A lock whose holder pauses a moment after each release: it widens the gaps
    between the servers' steps under their state lock, where another thread's step
    may run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pause = threading.Event()  # (never set: a pause of a known length)

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
        self._pause.wait(0.001)


def test_completions_that_return_together_leave_a_thread_for_the_next_item() -> None:
    """Three completions held at once (four threads), released together, then one
    more item, twenty times. A thread that decided to leave still counted as free
    until its exit: the others returning meanwhile left too, or the one taking the
    turn started no thread, and within a few rounds no thread waited for the turn:
    the items after that never ran (a point-to-point receive then waited out its
    timeout)."""
    done = threading.Semaphore(0)
    entered = threading.Semaphore(0)
    release = threading.Event()

    def execute(item: int) -> Callable[[], None]:
        def complete() -> None:
            if item < 3:
                entered.release()
                release.wait(10)
            done.release()

        return complete

    servers: OrderedServers[int] = OrderedServers(execute, name="t", os_name="t")
    servers._state = _PausingLock()  # type: ignore[assignment]
    for round_ in range(20):
        release.clear()
        for i in range(3):
            servers.put(i)
        ran = all(entered.acquire(timeout=10) for _ in range(3))
        assert ran, f"round {round_}: no thread ran the round's items"
        release.set()
        assert all(done.acquire(timeout=10) for _ in range(3)), f"round {round_}"
        servers.put(3)
        assert done.acquire(timeout=10), f"round {round_}: no thread ran the next item"
        assert servers.threads >= 1
    servers.stop()
    assert servers.join(10)


def test_a_completion_may_stop_and_join_its_own_servers() -> None:
    """A callback that shuts the group (or DDP hook state) down joins the threads
    from one of them: it waits for the others, not for itself (joining the
    calling thread raised RuntimeError, and the shutdown was left half done)."""
    joined: list[bool] = []
    ran: list[int] = []

    def execute(item: int) -> Callable[[], None]:
        ran.append(item)

        def complete() -> None:
            if item == 0:
                servers.stop()
                joined.append(servers.join(10))

        return complete

    servers: OrderedServers[int] = OrderedServers(execute, name="t", os_name="t")
    servers.put(0)
    servers.put(1)  # queued before the stop: it still runs
    assert _wait_for(lambda: bool(joined))
    assert joined == [True] and ran == [0, 1]
    assert servers.join(10) and servers.threads == 0


def _wait_for(cond: Callable[[], bool], limit: float = 10.0) -> bool:
    """Poll ``cond`` (a state the test has no event for) for up to ``limit`` s."""
    import time

    deadline = time.monotonic() + limit
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()
