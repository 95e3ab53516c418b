"""Render a :class:`~dlcp.switch.policy.SwitchPolicy` as a Linux ``tc`` profile:
strict priority classes with WRED-by-colour dropping, emulated with HTB + pfifo +
u32 on one egress interface (the namespace testbed's commodity-switch profile;
``testbed.switch_profile`` installs it and reads its counters).

Tree for a policy with ``n_classes`` (handles are hex, as ``tc`` reads them)::

    1: htb default 99
    └── 1:1     rate = ceil = link
        ├── 1:<c+1>0   class c: rate tiny, ceil link            (c = 0..n-1)
        │   ├── 1:<c+1>1  protected:  prio P(c), quantum weight*MTU, limit queue_limit(c)
        │   └── 1:<c+1>2  drop-elig.: prio P(c), quantum MTU, limit drop_threshold(c)
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
that DSCP with ``tos.ecn_droppable`` (Not-ECT) *and* UDP (``match ip protocol
17``): other packets with that TOS byte go to the class's protected leaf (a
second filter, ``prio 2``), since drop eligibility is a mark of DLCP's data, and
DLCP's TCP control channel, sent with the class-7 TOS byte, leaves Not-ECT (the
kernel sets a TCP socket's ECN bits itself). Everything else (other DSCPs,
ARP, IPv6) goes to best-effort. Note: with the default map class 0 is DSCP 0,
so ordinary Not-ECT UDP with TOS 0 lands in class 0's drop-eligible queue, and
ordinary TCP in its protected one.
IPv6 traffic-class matching is not done (u32 ``ip6 priority`` is unreliable in
this iproute2).
"""

from __future__ import annotations

from .policy import TC_FRAME_QUANTUM, FifoPolicy, SwitchPolicy

__all__ = ["BEST_EFFORT", "TINY_RATE", "class_id", "tc_commands"]

#: guaranteed rate of every priority class and leaf: tiny, so all real traffic is
#: borrowed and HTB prio decides (HTB warns that the quantum is small; harmless)
TINY_RATE = "8kbit"
_ROOT = "1:"
_TOP = "1:1"
BEST_EFFORT = "1:99"


def _rate(mbit: float) -> str:
    kbit = round(mbit * 1000)
    return f"{kbit}kbit"


def class_id(c: int, leaf: int) -> str:
    """``1:<c+1><leaf>``: leaf 0 is the class itself, 1 protected, 2 drop-eligible."""
    return f"1:{c + 1}{leaf}"


def _qdisc_handle(classid: str) -> str:
    return classid.split(":")[1] + ":"


def tc_commands(policy: SwitchPolicy | FifoPolicy, dev: str) -> list[list[str]]:
    """The ``tc`` argv lists that install ``policy`` on egress of ``dev`` (after
    any existing root qdisc has been removed; ``testbed.switch_profile.apply``
    does that)."""
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
        leaf(_TOP, BEST_EFFORT, 0, TC_FRAME_QUANTUM, policy.queue_packets)
        return cmds

    for c in reversed(range(policy.n_classes)):
        prio = policy.htb_prio(c)
        cmds.append(
            ["tc", "class", "add", "dev", dev, "parent", _TOP, "classid", class_id(c, 0),
             "htb", "rate", TINY_RATE, "ceil", link, "prio", str(prio)]
        )  # fmt: skip
        leaf(class_id(c, 0), class_id(c, 1), prio,
             policy.protected_weight * TC_FRAME_QUANTUM, policy.queue_limit(c))  # fmt: skip
        leaf(class_id(c, 0), class_id(c, 2), prio, TC_FRAME_QUANTUM,
             policy.drop_threshold(c))  # fmt: skip
    leaf(_TOP, BEST_EFFORT, policy.best_effort_prio, TC_FRAME_QUANTUM, policy.queue_packets)

    def tos_filter(prio: int, tos: int, flowid: str, *match: str) -> None:
        cmds.append(
            ["tc", "filter", "add", "dev", dev, "parent", _ROOT, "protocol", "ip",
             "prio", str(prio), "u32", "match", "ip", "tos", f"0x{tos:02x}", "0xff", *match,
             "flowid", flowid]
        )  # fmt: skip

    for c in reversed(policy.marked_classes()):  # (those above the policy's: its top queue)
        q = policy.queue_of(c)
        for tos in policy.tos_values(c, drop=False):
            tos_filter(1, tos, class_id(q, 1))
        for tos in policy.tos_values(c, drop=True):
            # drop-eligible: DLCP's data (UDP) only; anything else with that TOS
            # byte (DLCP's TCP control channel, whose ECN bits the kernel clears)
            # is protected, as the P4 program treats what it does not parse as DLCP
            tos_filter(1, tos, class_id(q, 2), "match", "ip", "protocol", "17", "0xff")
            tos_filter(2, tos, class_id(q, 1))
    return cmds
