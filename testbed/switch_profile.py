"""Commodity-switch profile on Linux: install, remove and read the ``tc`` profile of a
:class:`SwitchPolicy` (strict priority classes with WRED-by-colour dropping) on one
egress interface of a router namespace.

The policy model lives in :mod:`dlcp.switch.policy` and its ``tc`` rendering in
:mod:`dlcp.switch.linux_tc` (see there for the HTB tree and why it looks as it does);
both are re-exported here so testbed code keeps importing them from this module.
:class:`FifoPolicy` is the baseline: one FIFO at link rate.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from dlcp.switch.linux_tc import BEST_EFFORT, class_id, tc_commands
from dlcp.switch.policy import FifoPolicy, SwitchPolicy

__all__ = [
    "FifoPolicy",
    "SwitchPolicy",
    "apply",
    "class_counters",
    "remove",
    "tc_commands",
]

Run = Callable[[Sequence[str]], Any]


def remove(run: Run, dev: str) -> None:
    """Delete the root qdisc of ``dev`` (back to the kernel default); no error if
    there was none. ``run`` executes one argv (e.g. in the router namespace)."""
    with contextlib.suppress(subprocess.CalledProcessError, RuntimeError):  # none installed
        run(["tc", "qdisc", "del", "dev", dev, "root"])


def apply(run: Run, dev: str, policy: SwitchPolicy | FifoPolicy) -> None:
    """Install ``policy`` on ``dev``, replacing any existing root qdisc.
    ``run`` must raise on failure (as ``NetnsLine.run`` does)."""
    remove(run, dev)
    for argv in tc_commands(policy, dev):
        run(argv)


def _stdout(result: Any) -> str:
    out = getattr(result, "stdout", result)
    if isinstance(out, bytes):
        return out.decode()
    return str(out)


def class_counters(run: Run, dev: str) -> dict[str, dict[str, int]]:
    """Per leaf queue of the installed profile: ``packets`` and ``bytes`` sent,
    ``drops`` and current ``backlog`` packets, from ``tc -s -j qdisc show``.

    Names: ``c<c>-protected``, ``c<c>-drop``, ``best-effort`` (the FIFO baseline
    is its single ``best-effort`` leaf). ``run`` must return an object with a
    ``stdout`` string (``CompletedProcess``) or the string itself."""
    qdiscs = json.loads(_stdout(run(["tc", "-s", "-j", "qdisc", "show", "dev", dev])) or "[]")
    names = {BEST_EFFORT: "best-effort"}
    for c in range(8):
        names[class_id(c, 1)] = f"c{c}-protected"
        names[class_id(c, 2)] = f"c{c}-drop"
    out: dict[str, dict[str, int]] = {}
    for q in qdiscs:
        name = names.get(str(q.get("parent", "")))
        if name is None:
            continue
        out[name] = {
            "packets": int(q.get("packets", 0)),
            "bytes": int(q.get("bytes", 0)),
            "drops": int(q.get("drops", 0)),
            "backlog": int(q.get("qlen", 0)),
        }
    return out
