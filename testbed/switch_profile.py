"""Commodity-switch profile: strict priority classes with WRED-by-colour dropping,
emulated with Linux ``tc`` (HTB + pfifo + u32) on one egress interface.

One declarative :class:`SwitchPolicy` says what the switch does (classes, DSCP/ECN
map, link rate, queue limits, in-class weight); :func:`tc_commands` renders it as
``tc`` argv lists (later renderers will emit P4 table entries and vendor configs
from the same object). :class:`FifoPolicy` is the baseline: one FIFO at link rate.

Tree for a policy with ``n_classes`` (handles are hex, as ``tc`` reads them)::

    1: htb default 99
    └── 1:1     rate = ceil = link
        ├── 1:<c+1>0   class c: rate tiny, ceil link            (c = 0..n-1)
        │   ├── 1:<c+1>1  protected:  prio P(c), quantum weight*MTU, limit queue_packets
        │   └── 1:<c+1>2  drop-elig.: prio P(c), quantum MTU, limit drop_eligible_packets
        └── 1:99       best-effort (unmatched traffic): prio lowest, pfifo limit queue_packets

Strict priority between classes: every class and leaf has a tiny guaranteed
``rate`` (8 kbit), so practically all traffic is *borrowed* from ``1:1``; HTB
lends to the waiting leaf with the lowest ``prio`` number first, so the higher
DLCP class (lower HTB prio, ``P(c) = n_classes - 1 - c``) always wins. HTB has
only 8 prio levels (0..7): best-effort gets ``min(n_classes, 7)``, so with all 8
classes it shares level 7 with class 0 (round robin).

Design choice for the two leaves: they are HTB *children of their class* and
carry the class's prio (not siblings at distinct prios). HTB prio is effectively
global across the tree (the leaf prio decides who borrows first at every
level), and 8 levels cannot hold 2 * 8 class/colour levels plus best-effort; a
distinct prio for the drop-eligible leaf would also let it starve lower classes'
protected traffic less predictably than the commodity behaviour it emulates.
Keeping both leaves at the class prio preserves class-level strict priority
exactly; inside the class the two leaves share the class's service by deficit
round robin with quanta ``protected_weight * MTU`` : ``MTU``, and the
drop-eligible queue is shorter. Under congestion the Not-ECT (drop-eligible)
packets of a class therefore overflow their small queue first and get at most
``1 / (protected_weight + 1)`` of the class's share while any protected packet
waits, while ECT packets keep queueing -- the effect of WRED with a low drop
threshold for one colour. It is work-conserving: when protected traffic alone
does not fill the link, drop-eligible packets use the rest (as with WRED, which
only drops under a standing queue). Difference from real WRED: no probabilistic
early drop (kernel has no ``red``), tail drop per leaf instead.

Classification: u32 filters on the full IPv4 TOS byte (``match ip tos V 0xff``):
class ``c`` protected = DSCP ``tos.dscp[c]`` with every ECN codepoint except
``tos.ecn_droppable`` (so ECT(0), ECT(1) and CE by default); drop-eligible =
that DSCP with ``tos.ecn_droppable`` (Not-ECT). Everything else (other DSCPs,
ARP, IPv6) goes to best-effort. Note: with the default map class 0 is DSCP 0,
so ordinary Not-ECT traffic with TOS 0 lands in class 0's drop-eligible queue.
IPv6 traffic-class matching is not done (u32 ``ip6 priority`` is unreliable in
this iproute2).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlcp.proto.wire import TosMap

__all__ = [
    "FifoPolicy",
    "SwitchPolicy",
    "apply",
    "class_counters",
    "remove",
    "tc_commands",
]

Run = Callable[[Sequence[str]], Any]

#: guaranteed rate of every priority class and leaf: tiny, so all real traffic is
#: borrowed and HTB prio decides (HTB warns that the quantum is small; harmless)
TINY_RATE = "8kbit"
_ROOT = "1:"
_TOP = "1:1"
_BEST_EFFORT = "1:99"
_HTB_PRIOS = 8  # HTB prio levels 0..7
_MTU_QUANTUM = 1514


def _check_pos_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_rate(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"link_rate_mbit must be a positive number, got {value!r}")


def _rate(mbit: float) -> str:
    kbit = round(mbit * 1000)
    return f"{kbit}kbit"


@dataclass(frozen=True, slots=True)
class SwitchPolicy:
    """What a commodity switch port does; see the module docstring.

    ``n_classes``: DLCP priority classes 0..n_classes-1 get a queue pair each.
    ``queue_packets``: limit of a protected queue (and of best-effort).
    ``drop_eligible_packets``: limit of the drop-eligible queue of a class
    (must be smaller). ``protected_weight``: protected : drop-eligible service
    ratio inside a class while both are backlogged.
    """

    n_classes: int = 8
    tos: TosMap = field(default_factory=TosMap)
    link_rate_mbit: float = 1000.0
    queue_packets: int = 100
    drop_eligible_packets: int = 20
    protected_weight: int = 16

    def __post_init__(self) -> None:
        if (
            not isinstance(self.n_classes, int)
            or isinstance(self.n_classes, bool)
            or not 1 <= self.n_classes <= 8
        ):
            raise ValueError(f"n_classes must be 1..8, got {self.n_classes!r}")
        if not isinstance(self.tos, TosMap):
            raise ValueError(f"tos must be a TosMap, got {type(self.tos).__name__}")
        _check_rate(self.link_rate_mbit)
        _check_pos_int("queue_packets", self.queue_packets)
        _check_pos_int("drop_eligible_packets", self.drop_eligible_packets)
        _check_pos_int("protected_weight", self.protected_weight)
        if self.drop_eligible_packets >= self.queue_packets:
            raise ValueError(
                f"drop_eligible_packets ({self.drop_eligible_packets}) must be smaller "
                f"than queue_packets ({self.queue_packets}): drop-eligible packets "
                "must overflow first"
            )
        used = [self.tos.dscp[c] for c in range(self.n_classes)]
        if len(set(used)) != len(used):
            raise ValueError(f"classes 0..{self.n_classes - 1} need distinct DSCPs, got {used}")
        if self.tos.ecn_protected == self.tos.ecn_droppable:
            raise ValueError("tos.ecn_protected and tos.ecn_droppable must differ")

    # ---- declarative view, shared by every renderer -----------------------------

    def htb_prio(self, c: int) -> int:
        """HTB prio (0 = served first) of DLCP class ``c``: higher class, lower number."""
        return self.n_classes - 1 - c

    @property
    def best_effort_prio(self) -> int:
        return min(self.n_classes, _HTB_PRIOS - 1)

    def tos_values(self, c: int, *, drop: bool) -> list[int]:
        """TOS bytes of class ``c``'s drop-eligible (``drop``) or protected packets."""
        base = self.tos.dscp[c] << 2
        if drop:
            return [base | self.tos.ecn_droppable]
        return [base | ecn for ecn in range(4) if ecn != self.tos.ecn_droppable]

    def leaves(self) -> dict[str, tuple[str, int]]:
        """Readable leaf name -> (HTB classid, queue limit in packets)."""
        out: dict[str, tuple[str, int]] = {}
        for c in reversed(range(self.n_classes)):
            out[f"c{c}-protected"] = (_class_id(c, 1), self.queue_packets)
            out[f"c{c}-drop"] = (_class_id(c, 2), self.drop_eligible_packets)
        out["best-effort"] = (_BEST_EFFORT, self.queue_packets)
        return out


@dataclass(frozen=True, slots=True)
class FifoPolicy:
    """Baseline: one FIFO of ``queue_packets`` drained at ``link_rate_mbit``."""

    link_rate_mbit: float = 1000.0
    queue_packets: int = 100

    def __post_init__(self) -> None:
        _check_rate(self.link_rate_mbit)
        _check_pos_int("queue_packets", self.queue_packets)


def _class_id(c: int, leaf: int) -> str:
    """``1:<c+1><leaf>``: leaf 0 is the class itself, 1 protected, 2 drop-eligible."""
    return f"1:{c + 1}{leaf}"


def _qdisc_handle(classid: str) -> str:
    return classid.split(":")[1] + ":"


def tc_commands(policy: SwitchPolicy | FifoPolicy, dev: str) -> list[list[str]]:
    """The ``tc`` argv lists that install ``policy`` on egress of ``dev`` (after
    any existing root qdisc has been removed; :func:`apply` does that)."""
    link = _rate(policy.link_rate_mbit)
    cmds: list[list[str]] = [
        ["tc", "qdisc", "add", "dev", dev, "root", "handle", _ROOT, "htb", "default", "99"],
        ["tc", "class", "add", "dev", dev, "parent", _ROOT, "classid", _TOP,
         "htb", "rate", link, "ceil", link],
    ]  # fmt: skip

    def leaf(parent: str, classid: str, prio: int, quantum: int, limit: int) -> None:
        cmds.append(
            ["tc", "class", "add", "dev", dev, "parent", parent, "classid", classid,
             "htb", "rate", TINY_RATE, "ceil", link, "prio", str(prio),
             "quantum", str(quantum)]
        )  # fmt: skip
        cmds.append(
            ["tc", "qdisc", "add", "dev", dev, "parent", classid,
             "handle", _qdisc_handle(classid), "pfifo", "limit", str(limit)]
        )  # fmt: skip

    if isinstance(policy, FifoPolicy):
        # a single leaf that everything defaults to: one FIFO at link rate
        leaf(_TOP, _BEST_EFFORT, 0, _MTU_QUANTUM, policy.queue_packets)
        return cmds

    for c in reversed(range(policy.n_classes)):
        prio = policy.htb_prio(c)
        cmds.append(
            ["tc", "class", "add", "dev", dev, "parent", _TOP, "classid", _class_id(c, 0),
             "htb", "rate", TINY_RATE, "ceil", link, "prio", str(prio)]
        )  # fmt: skip
        leaf(_class_id(c, 0), _class_id(c, 1), prio,
             policy.protected_weight * _MTU_QUANTUM, policy.queue_packets)  # fmt: skip
        leaf(_class_id(c, 0), _class_id(c, 2), prio, _MTU_QUANTUM,
             policy.drop_eligible_packets)  # fmt: skip
    leaf(_TOP, _BEST_EFFORT, policy.best_effort_prio, _MTU_QUANTUM, policy.queue_packets)

    for c in reversed(range(policy.n_classes)):
        for drop, lf in ((False, 1), (True, 2)):
            for tos in policy.tos_values(c, drop=drop):
                cmds.append(
                    ["tc", "filter", "add", "dev", dev, "parent", _ROOT, "protocol", "ip",
                     "prio", "1", "u32", "match", "ip", "tos", f"0x{tos:02x}", "0xff",
                     "flowid", _class_id(c, lf)]
                )  # fmt: skip
    return cmds


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
    names = {_BEST_EFFORT: "best-effort"}
    for c in range(8):
        names[_class_id(c, 1)] = f"c{c}-protected"
        names[_class_id(c, 2)] = f"c{c}-drop"
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
