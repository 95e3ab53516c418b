"""Python bytecodes executed per thread: how much interpreter work a transfer costs.

CPU time on a shared machine moves by 10-20 % from run to run; the number of
bytecodes a thread executes for the same work moves far less (what varies is how often
a loop turns: an I/O thread's receive calls), so it compares versions and engines where
timings cannot. :class:`BytecodeCounter` counts, with the
interpreter's trace hook and ``f_trace_opcodes``, every bytecode of every thread
started after :meth:`BytecodeCounter.install` (``threading.settrace``) and of the
installing thread's later calls (``sys.settrace``), while :attr:`BytecodeCounter.on`
is true, per thread, by the thread's name.

Tracing makes Python 10-50 times slower: count in a pass of its own, never while
timing. Frames of the files named in ``skip`` (the benchmark's own loop) are not
counted. Each thread counts into a cell of its own, so no count is lost to a thread
switch in the middle of an increment.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

__all__ = ["BytecodeCounter"]

_Trace = Callable[[FrameType, str, Any], Any]


class BytecodeCounter:
    """Bytecodes per thread name while :attr:`on` (see the module docstring)."""

    def __init__(self, skip: Iterable[str] = ()) -> None:
        #: count while true (the hook runs either way once installed)
        self.on = False
        self._skip = tuple(skip)
        #: (thread ident, thread name) -> [bytecodes] (an ident may be reused)
        self._cells: dict[tuple[int, str], list[int]] = {}
        self._installed = False
        #: the hooks this one replaced (a debugger's, coverage's), put back by uninstall
        self._before: tuple[Any, Any] = (None, None)

    def install(self) -> None:
        """Trace the threads started from now on, and this thread's calls (instead
        of any hook set before, which :meth:`uninstall` puts back)."""
        self._before = (threading.gettrace(), sys.gettrace())
        threading.settrace(self._call)
        sys.settrace(self._call)
        self._installed = True

    def uninstall(self) -> None:
        """The hooks as they were before :meth:`install`, for new threads and this
        one (threads already traced keep this hook until they end)."""
        if self._installed:
            threading.settrace(self._before[0])
            sys.settrace(self._before[1])
            self._installed = False

    def __enter__(self) -> BytecodeCounter:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def by_thread(self) -> dict[str, int]:
        """Bytecodes counted so far, summed per thread name."""
        out: dict[str, int] = {}
        for (_, name), cell in list(self._cells.items()):
            out[name] = out.get(name, 0) + cell[0]
        return out

    def _cell(self) -> list[int]:
        key = (threading.get_ident(), threading.current_thread().name)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells.setdefault(key, [0])
        return cell

    def _call(self, frame: FrameType, event: str, arg: Any) -> _Trace | None:
        # every frame gets the opcode hook, counting or not, so that a frame that
        # began before counting (an I/O thread's loop) is counted once it is on
        if self._skip and frame.f_code.co_filename.endswith(self._skip):
            return None
        frame.f_trace_opcodes = True
        cell = self._cell()

        def opcode(frame: FrameType, event: str, arg: Any) -> _Trace:
            if event == "opcode" and self.on:
                cell[0] += 1
            return opcode

        return opcode
