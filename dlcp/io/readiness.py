"""The I/O thread's selector: epoll, for reading only, with a lean ``select``.

:class:`ReadSelector` is a :class:`selectors.BaseSelector` that watches files for
reading (what an endpoint's I/O thread waits on: its data socket, control
connections, the wake socket, the native engine's reports). Its :meth:`select`
makes three Python calls whatever comes back (``selectors.EpollSelector``'s
makes five, and two more per ready file): the I/O thread calls it every turn.

One file may be set apart (:meth:`ReadSelector.set_apart`: the data socket, which
the native receive loop waits on itself): a second epoll set holds every other
file, so that the loop can sleep until one of them is ready without being woken
by data (:meth:`ReadSelector.others_fileno`, ``dlcp/io/_linger.h``).
"""

from __future__ import annotations

import contextlib
import select
import selectors
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ReadSelector"]

_READ = selectors.EVENT_READ


def _fd_of(fileobj: Any) -> int:
    fd = fileobj if isinstance(fileobj, int) else int(fileobj.fileno())
    if fd < 0:
        raise ValueError(f"invalid file descriptor {fd} ({fileobj!r} is closed?)")
    return fd


class ReadSelector(selectors.BaseSelector):
    """epoll for reading; see the module docstring."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        #: every watched file but the one set apart (set_apart)
        self._others = select.epoll()
        self._apart = -1
        #: file descriptor -> its key
        self._keys: dict[int, selectors.SelectorKey] = {}
        #: epoll's event limit per call: one per file watched (epoll needs one at least)
        self._max_events = 1
        #: what waits instead of epoll.poll (wait_with), if anything
        self._wait: Callable[[int, int, int], list[int]] | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        if events != _READ:
            raise ValueError(f"events={events!r}: this selector watches for reading only")
        fd = _fd_of(fileobj)
        if fd in self._keys:
            raise KeyError(f"{fileobj!r} (fd {fd}) is already registered")
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._epoll.register(fd, select.EPOLLIN)
        if fd != self._apart:
            try:
                self._others.register(fd, select.EPOLLIN)
            except BaseException:
                self._epoll.unregister(fd)
                raise
        self._keys[fd] = key
        self._max_events = len(self._keys)
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        """Stop watching ``fileobj``, which may have been closed since it was
        registered (the kernel has forgotten it then: it is found by identity)."""
        try:
            fd = _fd_of(fileobj)
        except ValueError:
            fd = next((k.fd for k in self._keys.values() if k.fileobj is fileobj), -1)
        key = self._keys.pop(fd, None)
        if key is None:
            raise KeyError(f"{fileobj!r} is not registered")
        with contextlib.suppress(OSError):  # (closed already: that took it off epoll's set)
            self._epoll.unregister(fd)
        if fd != self._apart:
            with contextlib.suppress(OSError):
                self._others.unregister(fd)
        self._max_events = max(len(self._keys), 1)
        return key

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """The files ready for reading, waiting at most ``timeout`` seconds (None:
        until one is; epoll rounds a wait up to whole milliseconds)."""
        keys = self._keys
        if self._wait is not None:
            limit = -1 if timeout is None else int(timeout * 1e9)
            fds = self._wait(self._epoll.fileno(), limit, self._max_events)
            return [(keys[fd], _READ) for fd in fds if fd in keys]
        try:
            ready = self._epoll.poll(-1.0 if timeout is None else timeout, self._max_events)
        except InterruptedError:
            return []
        try:
            return [(keys[fd], _READ) for fd, _ in ready]
        except KeyError:  # (one unregistered that the kernel still watches: a dup of it)
            return [(keys[fd], _READ) for fd, _ in ready if fd in keys]

    def set_apart(self, fileobj: Any) -> None:
        """Keep ``fileobj`` (registered or not) out of :meth:`others_fileno`'s set;
        one file at a time, before it is registered."""
        fd = _fd_of(fileobj)
        if self._keys:
            raise RuntimeError("set_apart: call it before any file is registered")
        self._apart = fd

    def wait_with(self, wait: Callable[[int, int, int], list[int]]) -> None:
        """From now on :meth:`select` waits through ``wait(epoll descriptor,
        timeout in nanoseconds or -1, event limit)``, which returns the ready
        descriptors as ``epoll.poll`` would (the native receive table's, which
        handles some control frames itself: :mod:`dlcp.io.control_in_waits`)."""
        self._wait = wait

    def fileno(self) -> int:
        """The epoll set's descriptor: readable while a watched file is."""
        return self._epoll.fileno()

    def others_fileno(self) -> int:
        """The descriptor of the epoll set of every watched file but the one set
        apart: readable while one of them is."""
        return self._others.fileno()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return {key.fileobj: key for key in self._keys.values()}

    def close(self) -> None:
        self._keys.clear()
        self._epoll.close()
        self._others.close()
