"""The process group's transport threads: operations one at a time in call order,
their futures completed outside that order.

An operation's collective must run in call order (the same on every rank), one
at a time: a *turn* that one thread holds. Completing the operation's future
runs whatever callbacks the caller chained to it, and a callback may start
another operation of the same group and wait for it: torch's PowerSGD hook
does, ``dist.all_reduce(..., async_op=True).get_future().wait()`` inside a
``.then`` callback. With one transport thread that waits for itself, forever
(the wait is torch's, no timeout applies). So the thread that ran an operation
passes the turn on before it completes the future, and a thread is always
waiting for the turn: two are kept, and a third is started whenever every
thread is inside callbacks (a callback that waits for an operation whose
callback waits in turn); threads beyond two leave once their callbacks return.
Futures of consecutive operations may then complete concurrently, in two
threads.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from dlcp.io.threads import name_os_thread

__all__ = ["OrderedServers", "result_of"]

log = logging.getLogger("dlcp.shims")

_Item = TypeVar("_Item")

#: threads kept: one holding or waiting for the turn while another completes futures
KEPT = 2


def result_of(fut: Any) -> Any:
    """A ``.then`` callback for the futures these threads complete: the result,
    or the exception re-raised. An exception *set* on a torch future is only a
    value to DDP's C++ reducer (it fails with "Unable to cast <message> to
    Tensor"); raised in a callback, it fails the chained future with its type and
    message."""
    return fut.wait()


class OrderedServers(Generic[_Item]):
    """Runs queued items one at a time in queue order with ``execute(item)``,
    which returns the item's completion; completions run after the turn has
    passed on (see the module doc). ``stop()`` lets queued items finish."""

    def __init__(
        self, execute: Callable[[_Item], Callable[[], None]], *, name: str, os_name: str
    ) -> None:
        self._execute = execute
        self._name, self._os_name = name, os_name
        self._items: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._turn = threading.Lock()
        self._state = threading.Lock()
        self._threads: set[threading.Thread] = set()
        #: threads waiting for the turn or holding it (not inside a completion, nor leaving)
        self._free = 0
        self._started = 0
        with self._state:
            self._start()

    def put(self, item: _Item) -> None:
        self._items.put(item)

    def stop(self) -> None:
        """No more items: the threads leave once the queued ones are done."""
        self._items.put(None)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every thread to leave; True if they all did.
        Called from one of these threads (a completion's callback that shuts its
        group down), it waits for the others: that one leaves once it returns."""
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        while True:
            with self._state:
                left = next((t for t in self._threads if t is not me), None)
            if left is None:
                return True
            left.join(max(0.0, deadline - time.monotonic()))
            if left.is_alive():
                return False

    @property
    def threads(self) -> int:
        """Threads running now (for tests and diagnostics)."""
        with self._state:
            return len(self._threads)

    def _start(self) -> None:  # (under self._state)
        self._started += 1
        thread = threading.Thread(
            target=self._loop, name=f"{self._name}-{self._started}", daemon=True
        )
        # started, then counted: one that fails to start never is, and one that starts
        # cannot leave before it is (leaving takes self._state, held here)
        thread.start()
        self._threads.add(thread)
        self._free += 1

    def _loop(self) -> None:
        name_os_thread(self._os_name)
        me = threading.current_thread()
        counted = True  # whether this thread is one of self._free
        try:
            while True:
                with self._turn:
                    item = self._items.get()
                    if item is None:
                        self._items.put(None)  # for the other threads
                        return
                    try:
                        complete = self._execute(item)
                    except Exception:  # (execute settles its own errors: a defect)
                        # the thread stays: it may be the only one the turn waits for
                        log.exception("%s: running an operation failed", self._name)
                        continue
                with self._state:
                    self._free -= 1
                    counted = False
                    if self._free == 0:  # nobody would take the next turn
                        try:
                            self._start()
                        except RuntimeError:  # (no thread to be had: this one goes on)
                            log.exception(
                                "%s: no thread for the next operation; it waits until this "
                                "one's completion returns",
                                self._name,
                            )
                try:
                    complete()
                except Exception:  # a callback's error must not end the group's thread
                    log.exception("%s: completing an operation failed", self._name)
                with self._state:
                    # leave if KEPT others are free, never counted again: a thread
                    # counted as free until its exit made others that looked
                    # meanwhile leave too, or not start one, and the group was left
                    # with no thread (the next item never ran)
                    if self._free >= KEPT:
                        return
                    self._free += 1
                    counted = True
        finally:
            with self._state:
                self._threads.discard(me)
                if counted:
                    self._free -= 1
