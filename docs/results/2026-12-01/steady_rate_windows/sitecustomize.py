"""Probes of a testbed rank, loaded as ``sitecustomize`` (put this folder on PYTHONPATH
after the tree under test); each is on when its variable names a file prefix, and
each rank writes ``<prefix>.<pid>`` (JSON) when it exits:

- ``RATEPROF``: every rate report the rank's meter makes (time, shared, rates);
  ``rate_steadiness.py <prefix>`` reads them.
- ``TURNPROF`` (rank 1 only): the I/O turns by what they had to do (the files
  ``select`` found ready, and ``+timer`` when the session's timer was due).
- ``FINPROF``: the time from each round's last batch sent (``Outbox._round_sent``)
  to its STOP, the STOPs that came before it, and whether each FINISH the rank
  received found its message ended, under way or unknown.

    PYTHONPATH=<tree>:docs/results/2026-12-01/steady_rate_windows RATEPROF=/tmp/rp \\
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


def _rate_reports(module: Any) -> None:
    log: list[Any] = []
    _record("RATEPROF", log)
    sample = module.RateMeter.sample

    def recorded(self: Any, *, now: float) -> dict[int, float]:
        rates = sample(self, now=now)
        if rates:
            log.append([now, self.shared, {str(k): v for k, v in rates.items()}])
        return rates

    module.RateMeter.sample = recorded


def _turn_inputs(module: Any) -> None:
    kinds: collections.Counter[str] = collections.Counter()
    _record("TURNPROF", kinds)
    take = module.IOLoop._take_input

    def counted(self: Any, sel: Any, ready: Any, timer: Any, now: float) -> float:
        name = "+".join(sorted({key.data for key, _ in ready}))
        if timer is not None and timer <= now:
            name += "+timer"
        kinds[name or "nothing"] += 1
        return take(self, sel, ready, timer, now)

    module.IOLoop._take_input = counted


_finish = {"stop_after_sent": [], "stop_before_sent": 0, "ended": 0, "live": 0, "unknown": 0}


def _sender_side(module: Any) -> None:
    sent_at: dict[Any, float] = {}
    outbox = module.Outbox
    round_sent, on_control = outbox._round_sent, outbox.on_control

    def sent(self: Any, key: Any, o: Any, *, now: float) -> None:
        sent_at[id(self), key] = time.monotonic()
        round_sent(self, key, o, now=now)

    def control(self: Any, key: Any, ctrl: Any, *, now: float) -> None:
        if type(ctrl).__name__ == "Stop":
            at = sent_at.pop((id(self), key), None)
            if at is None:
                _finish["stop_before_sent"] += 1
            else:
                _finish["stop_after_sent"].append(time.monotonic() - at)
        on_control(self, key, ctrl, now=now)

    outbox._round_sent, outbox.on_control = sent, control


def _receiver_side(module: Any) -> None:
    on_finish = module.Inbox.on_finish

    def finish(self: Any, key: Any, message: Any, *, now: float) -> None:
        if self._ended.get(key) is not None:
            _finish["ended"] += 1
        elif self._incoming.get(key) is not None:
            _finish["live"] += 1
        else:
            _finish["unknown"] += 1
        on_finish(self, key, message, now=now)

    module.Inbox.on_finish = finish


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


if os.environ.get("RATEPROF"):
    _patches["dlcp.proto.rate_meter"] = _rate_reports
if os.environ.get("TURNPROF") and os.environ.get("RANK") == "1":
    _patches["dlcp.io.io_loop"] = _turn_inputs
if os.environ.get("FINPROF"):
    _patches["dlcp.proto.outbox"] = _sender_side
    _patches["dlcp.proto.inbox"] = _receiver_side
    _record("FINPROF", _finish)
if _patches:
    sys.meta_path.insert(0, _AfterImport())
