"""Probes of a testbed rank, loaded as ``sitecustomize`` (put this folder on PYTHONPATH
after the tree under test); each is on when its variable names a file prefix, and each
rank writes ``<prefix>.<pid>`` (JSON) when it exits:

- ``WINDOWPROF``: every rate window the rank's meter reports on: the time of the report,
  whether it was shared, the window's start, the idle time in it, the bytes per source
  and the rates reported (``windows.py <prefix>`` reads them).
- ``ENDPROF``: the I/O thread's receive calls by how each ended: ``nolinger`` (another
  file was ready when the turn began), ``caller`` (a caller waited for the lock),
  ``deadline-rate`` (at the rate window's deadline), ``deadline-other`` (another
  deadline of the turn), ``early`` (the socket ran dry, a trickle, another file, a
  run that needed Python); ``+done`` if a message ended in it, ``+open`` if one opened.
- ``CTLPROF``: the I/O thread's counts when it ends: control frames Python read
  (``control_in``) and sent, receive calls, and RATE reports the receive loop handed to
  the pacers itself (``rates_native``, 0 on a tree without it).

    PYTHONPATH=<tree>:docs/results/2026-12-01/rate_frames_in_the_wait CTLPROF=/tmp/cp \\
      .venv/bin/dlcp testbed run --scenario clean --transport dlcp --epochs 3 --hidden 1024
"""

from __future__ import annotations

import atexit
import collections
import importlib.abc
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

_patches: dict[str, Callable[[Any], None]] = {}


def _record(var: str, data: Any) -> None:
    def dump() -> None:
        with open(f"{os.environ[var]}.{os.getpid()}", "w") as f:
            json.dump(data, f)

    atexit.register(dump)


def _windows(module: Any) -> None:
    log: list[Any] = []
    _record("WINDOWPROF", log)
    sample = module.RateMeter.sample

    def recorded(self: Any, *, now: float) -> dict[int, float]:
        start, idle, nbytes = self._start, self._idle, dict(self._bytes)
        rates = sample(self, now=now)
        if rates:
            log.append([now, self.shared, start, idle, {str(k): v for k, v in nbytes.items()},
                        {str(k): v for k, v in rates.items()}])  # fmt: skip
        return rates

    module.RateMeter.sample = recorded


def _receive_endings(module: Any) -> None:
    kinds: collections.Counter[str] = collections.Counter()
    _record("ENDPROF", kinds)
    receive = module.IOLoop._receive_data

    def counted(self: Any, start: float, timer: Any = None, *, may_linger: bool = True) -> None:
        inbox = self._session._inbox
        before = set(inbox._incoming)
        until = self._next_time(start, timer)
        meter_due, callers = inbox._meter.deadline, bool(self._callers)
        receive(self, start, timer, may_linger=may_linger)
        end, after = time.monotonic(), set(inbox._incoming)
        if not may_linger:
            kind = "nolinger"
        elif callers:
            kind = "caller"
        elif end >= until - 0.0003:
            rate = meter_due is not None and abs(meter_due - until) < 1e-6
            kind = "deadline-rate" if rate else "deadline-other"
        else:
            kind = "early"
        kind += ("+done" if before - after else "") + ("+open" if after - before else "")
        kinds[kind] += 1

    module.IOLoop._receive_data = counted


def _control_counts(module: Any) -> None:
    run = module.IOLoop._run

    def counted(self: Any) -> None:
        try:
            run(self)
        finally:
            rates = getattr(self, "_rates", None)
            with open(f"{os.environ['CTLPROF']}.{os.getpid()}", "w") as f:
                json.dump({"control_in": self._stats.control_in,
                           "control_out": self._stats.control_out,
                           "receive_calls": self._stats.receive_calls,
                           "rates_native": rates.taken if rates is not None else 0}, f)  # fmt: skip

    module.IOLoop._run = counted


def _io_loop(module: Any) -> None:
    if os.environ.get("ENDPROF"):
        _receive_endings(module)
    if os.environ.get("CTLPROF"):
        _control_counts(module)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a module's patch once the module has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = _patches.pop(name, None)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        assert spec is not None and spec.loader is not None
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("WINDOWPROF"):
    _patches["dlcp.proto.rate_meter"] = _windows
if os.environ.get("ENDPROF") or os.environ.get("CTLPROF"):
    _patches["dlcp.io.io_loop"] = _io_loop
if _patches:
    sys.meta_path.insert(0, _AfterImport())
