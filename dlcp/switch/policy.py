"""One switch policy for every target: what a DLCP-aware switch port does.

:class:`SwitchPolicy` says it once -- priority classes, the DSCP/ECN map
(:class:`~dlcp.proto.wire.TosMap`), link rate, per-class queue sizes and the queue
depth above which drop-eligible packets are dropped -- and each renderer turns the
same object into one target's configuration:

* :func:`dlcp.switch.linux_tc.tc_commands`: the Linux ``tc`` profile of the namespace
  testbed (``testbed.switch_profile`` re-exports it);
* :func:`dlcp.switch.p4entries.policy_entries` (and the topology routes of
  :mod:`dlcp.switch.controller`): P4Runtime table entries for the BMv2 program;
* :func:`dlcp.switch.sonic.sonic_config`: a SONiC-style ``config_db`` QoS fragment.

Classes and queues: DLCP class ``c`` (0..n_classes-1; 7 is the most urgent, as in
the spec's ``tclass``) is served from queue ``c``; strict priority serves the higher
queue first. Senders use all eight classes whatever a switch has, and the control
channel travels with class 7's DSCP: with fewer than eight queues, classes
``n_classes``..7 share the top queue (and its thresholds), the most urgent one,
unless the TOS map sends them unmarked (DSCP 0) or with a lower class's DSCP
(:meth:`SwitchPolicy.marked_classes`).
Protected packets of class ``c`` may fill ``queue_limit(c)`` packets;
drop-eligible ones (ECN Not-ECT on the wire, the ``drop`` bit in the DLCP header; a
retransmission keeps the bit but travels protected, spec §2.3) are
dropped once the queue holds more than ``drop_threshold(c)`` packets. Traffic outside
the classes is best effort (queue 0 on switches with 8 queues).

Policy files are TOML (:func:`load_policy`); every key is optional::

    n_classes = 8
    link_rate_mbit = 1000
    queue_packets = 100          # protected queue limit of every class
    drop_eligible_packets = 20   # drop threshold of every class
    protected_weight = 16        # tc only: protected : drop-eligible service share
    mtu_bytes = 1500             # packets -> bytes for byte-based thresholds (SONiC)

    [tos]                        # the spec's TosMap (section 7)
    dscp = [0, 8, 16, 24, 32, 40, 48, 56]
    ecn_protected = 2            # ECT(0)
    ecn_droppable = 0            # Not-ECT

    [classes.7]                  # per-class overrides
    queue_packets = 200
    drop_eligible_packets = 40
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from dlcp.proto.wire import TosMap

from ..errors import UsageError

__all__ = [
    "ALL_CLASSES",
    "ClassQueue",
    "FifoPolicy",
    "PolicyError",
    "SwitchPolicy",
    "load_policy",
    "on_link",
    "policy_from_dict",
]

_HTB_PRIOS = 8  # HTB prio levels 0..7
N_QUEUES = 8  # priority queues of the P4 / SONiC targets (BMv2 --priority-queues 8)


class PolicyError(UsageError):
    """A switch policy is invalid; the message names the bad field."""


#: the deepest queue the P4 program can see (``enq_qdepth`` is 19 bits)
MAX_QUEUE_PACKETS = (1 << 19) - 1
#: tc's HTB quantum is 32 bits
_MAX_QUANTUM = (1 << 32) - 1
#: tc's quantum per unit of ``protected_weight``: one full Ethernet frame (the
#: tc renderer's HTB quantum of the drop-eligible leaf)
TC_FRAME_QUANTUM = 1514
_DEPTH_LIMIT: dict[str, Any] = {
    "maximum": MAX_QUEUE_PACKETS,
    "why": "the deepest queue the P4 switch measures, 19 bits",
}


def _check_pos_int(name: str, value: object, *, maximum: int | None = None, why: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PolicyError(f"{name} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise PolicyError(f"{name} must be at most {maximum} ({why}), got {value!r}")


def _check_rate(value: object) -> None:
    # tc renders the rate in kbit: at least one, and finite
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.001 <= value < 1e9:
        raise PolicyError(
            f"link_rate_mbit must be a number from 0.001 (1 kbit/s) to 1e9, got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class ClassQueue:
    """Per-class override of the queue limit and drop threshold (``None``: the
    policy-wide value)."""

    cls: int
    queue_packets: int | None = None
    drop_eligible_packets: int | None = None


#: the priority classes DLCP senders use (the spec's tclass prio: 3 bits)
ALL_CLASSES = range(8)


@dataclass(frozen=True, slots=True)
class SwitchPolicy:
    """What a DLCP-aware switch port does; see the module docstring.

    ``n_classes``: DLCP priority classes 0..n_classes-1 get a queue each (the
    classes above share the top one, :meth:`queue_of`).
    ``queue_packets``: limit of a protected queue (and of best-effort).
    ``drop_eligible_packets``: queue depth above which drop-eligible packets are
    dropped (the tc profile's drop-eligible queue limit; must be smaller).
    ``protected_weight``: tc only, protected : drop-eligible service ratio inside
    a class while both are backlogged. ``classes``: per-class overrides.
    ``mtu_bytes``: packet size used where a target counts bytes.
    """

    n_classes: int = 8
    tos: TosMap = field(default_factory=TosMap)
    link_rate_mbit: float = 1000.0
    queue_packets: int = 100
    drop_eligible_packets: int = 20
    protected_weight: int = 16
    classes: tuple[ClassQueue, ...] = ()
    mtu_bytes: int = 1500

    def __post_init__(self) -> None:
        if (
            not isinstance(self.n_classes, int)
            or isinstance(self.n_classes, bool)
            or not 1 <= self.n_classes <= 8
        ):
            raise PolicyError(f"n_classes must be 1..8, got {self.n_classes!r}")
        if not isinstance(self.tos, TosMap):
            raise PolicyError(f"tos must be a TosMap, got {type(self.tos).__name__}")
        _check_rate(self.link_rate_mbit)
        for name in ("queue_packets", "drop_eligible_packets"):
            _check_pos_int(name, getattr(self, name), **_DEPTH_LIMIT)
        _check_pos_int("mtu_bytes", self.mtu_bytes, maximum=65535, why="an IPv4 packet")
        _check_pos_int(
            "protected_weight",
            self.protected_weight,
            maximum=_MAX_QUANTUM // TC_FRAME_QUANTUM,
            why=f"tc's quantum, weight x {TC_FRAME_QUANTUM} bytes, is 32 bits",
        )
        if self.drop_eligible_packets >= self.queue_packets:
            raise PolicyError(
                f"drop_eligible_packets ({self.drop_eligible_packets}) must be smaller "
                f"than queue_packets ({self.queue_packets}): drop-eligible packets "
                "must overflow first"
            )
        seen: set[int] = set()
        for o in self.classes:
            if not isinstance(o, ClassQueue):
                raise PolicyError(f"classes: entries must be ClassQueue, got {o!r}")
            where = f"classes.{o.cls}"
            if isinstance(o.cls, bool) or not isinstance(o.cls, int):
                raise PolicyError(f"{where}: class must be an integer")
            if not 0 <= o.cls < self.n_classes:
                raise PolicyError(f"{where}: no such class (classes are 0..{self.n_classes - 1})")
            if o.cls in seen:
                raise PolicyError(f"{where}: class given twice")
            seen.add(o.cls)
            for name in ("queue_packets", "drop_eligible_packets"):
                if getattr(o, name) is not None:
                    _check_pos_int(f"{where}.{name}", getattr(o, name), **_DEPTH_LIMIT)
            q, d = self.queue_limit(o.cls), self.drop_threshold(o.cls)
            if d >= q:
                raise PolicyError(
                    f"{where}.drop_eligible_packets ({d}) must be smaller than "
                    f"{where}.queue_packets ({q}): drop-eligible packets must overflow first"
                )
        used = [self.tos.dscp[c] for c in range(self.n_classes)]
        if len(set(used)) != len(used):
            raise PolicyError(
                f"tos.dscp: classes 0..{self.n_classes - 1} need distinct DSCPs, got {used}"
            )
        if self.tos.ecn_protected == self.tos.ecn_droppable:
            raise PolicyError("tos.ecn_protected and tos.ecn_droppable must differ")

    @classmethod
    def for_link(cls, link_rate_mbit: float, buffer_packets: int) -> SwitchPolicy:
        """The policy for a topology's links (the testbed's, ``dlcp switch config``'s
        default): queues of ``buffer_packets``, drop-eligible packets dropped above
        two fifths of that.

        Two fifths, not less: the threshold should hold one sender's burst, so that
        drop-eligible packets are dropped when several senders or cross traffic
        congest a port, not by a lone message. With a fifth (20 of 100 packets), a
        ring step of the testbed's training (27 packets, most of them
        drop-eligible) overflowed it with no other traffic: 0.7 % of the gradient
        values lost and retransmissions in the ``clean`` scenario; with two fifths,
        none (docs/testbed.md)."""
        return cls(
            link_rate_mbit=link_rate_mbit,
            queue_packets=buffer_packets,
            drop_eligible_packets=max(1, min(buffer_packets - 1, buffer_packets * 2 // 5)),
        )

    # ---- declarative view, shared by every renderer -----------------------------

    def _override(self, c: int) -> ClassQueue | None:
        return next((o for o in self.classes if o.cls == c), None)

    def queue_limit(self, c: int) -> int:
        """Packets the protected queue of class ``c`` holds."""
        o = self._override(c)
        return o.queue_packets if o and o.queue_packets is not None else self.queue_packets

    def drop_threshold(self, c: int) -> int:
        """Queue depth (packets) above which class ``c``'s drop-eligible packets drop."""
        o = self._override(c)
        if o and o.drop_eligible_packets is not None:
            return o.drop_eligible_packets
        return self.drop_eligible_packets

    def queue_of(self, c: int) -> int:
        """Switch queue (0 lowest .. n_classes-1 most urgent) that serves DLCP
        class ``c`` (0..7): its own, or the top one for a class above the
        policy's (its packets, and the control channel's with class 7's DSCP,
        are the most urgent: they must not fall to best effort)."""
        if c not in ALL_CLASSES:
            raise PolicyError(f"class {c} outside 0..7")
        return min(c, self.n_classes - 1)

    def marked_classes(self) -> list[int]:
        """The classes whose DSCP this policy maps to a queue: its own, then each
        class above them with a DSCP of its own (not 0, the best-effort codepoint,
        nor a lower class's), which shares the top queue. A map that gives the
        upper classes DSCP 0 sends them, and the control channel, best effort."""
        out = list(range(self.n_classes))
        seen = {self.tos.dscp[c] for c in out} | {0}
        for c in range(self.n_classes, len(ALL_CLASSES)):
            if self.tos.dscp[c] not in seen:
                seen.add(self.tos.dscp[c])
                out.append(c)
        return out

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
        """Readable tc leaf name -> (HTB classid, queue limit in packets)."""
        out: dict[str, tuple[str, int]] = {}
        for c in reversed(range(self.n_classes)):
            out[f"c{c}-protected"] = (f"1:{c + 1}1", self.queue_limit(c))
            out[f"c{c}-drop"] = (f"1:{c + 1}2", self.drop_threshold(c))
        out["best-effort"] = ("1:99", self.queue_packets)
        return out


@dataclass(frozen=True, slots=True)
class FifoPolicy:
    """Baseline: one FIFO of ``queue_packets`` drained at ``link_rate_mbit``."""

    link_rate_mbit: float = 1000.0
    queue_packets: int = 100

    def __post_init__(self) -> None:
        _check_rate(self.link_rate_mbit)
        _check_pos_int("queue_packets", self.queue_packets)


_Policy = TypeVar("_Policy", SwitchPolicy, FifoPolicy)


def on_link(policy: _Policy, link_rate_mbit: float | None, queue_packets: int | None) -> _Policy:
    """``policy`` for one link that has a rate or buffer of its own (None: the
    policy's); a DLCP policy's queues and drop-eligible thresholds, per-class
    overrides included, keep their share of the buffer. The testbed installs
    this on every link a topology file names in ``[[links]]``, and ``dlcp switch
    config`` prints it."""
    rate = policy.link_rate_mbit if link_rate_mbit is None else link_rate_mbit
    queue = policy.queue_packets if queue_packets is None else queue_packets
    if isinstance(policy, SwitchPolicy):
        scale = queue / policy.queue_packets

        def scaled(packets: int, limit: int | None = None) -> int:
            """``packets`` scaled to the link's buffer, at least 1, at most ``limit``."""
            value = round(packets * scale)
            return max(1, value if limit is None else min(limit, value))

        def scaled_class(o: ClassQueue) -> ClassQueue:
            limit = None if o.queue_packets is None else scaled(o.queue_packets)
            drop = o.drop_eligible_packets
            return dataclasses.replace(
                o,
                queue_packets=limit,
                drop_eligible_packets=None if drop is None else scaled(drop, (limit or queue) - 1),
            )

        return dataclasses.replace(
            policy,
            link_rate_mbit=rate,
            queue_packets=queue,
            drop_eligible_packets=scaled(policy.drop_eligible_packets, queue - 1),
            classes=tuple(scaled_class(o) for o in policy.classes),
        )
    return dataclasses.replace(policy, link_rate_mbit=rate, queue_packets=queue)


# ---- policy files -------------------------------------------------------------

_KEYS = frozenset(
    {
        "n_classes",
        "link_rate_mbit",
        "queue_packets",
        "drop_eligible_packets",
        "protected_weight",
        "mtu_bytes",
        "tos",
        "classes",
    }
)
_TOS_KEYS = frozenset({"dscp", "ecn_protected", "ecn_droppable"})
_CLASS_KEYS = frozenset({"queue_packets", "drop_eligible_packets"})


def _unknown(data: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    extra = sorted(set(data) - known)
    if extra:
        raise PolicyError(f"{where}{extra[0]}: unknown field (known: {', '.join(sorted(known))})")


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyError(f"{where}: must be an integer, got {value!r}")
    return value


def _tos(data: Any) -> TosMap:
    if not isinstance(data, Mapping):
        raise PolicyError("tos: must be a table (dscp, ecn_protected, ecn_droppable)")
    _unknown(data, _TOS_KEYS, "tos.")
    kw: dict[str, Any] = {}
    if "dscp" in data:
        dscp = data["dscp"]
        if not isinstance(dscp, list):
            raise PolicyError("tos.dscp: must be a list of 8 DSCPs")
        kw["dscp"] = tuple(_int(d, f"tos.dscp[{i}]") for i, d in enumerate(dscp))
    for k in ("ecn_protected", "ecn_droppable"):
        if k in data:
            kw[k] = _int(data[k], f"tos.{k}")
    try:
        return TosMap(**kw)
    except ValueError as e:
        raise PolicyError(f"tos: {e}") from e


def _classes(data: Any) -> tuple[ClassQueue, ...]:
    if not isinstance(data, Mapping):
        raise PolicyError("classes: must be a table of class tables, e.g. [classes.7]")
    out = []
    for key, spec in data.items():
        try:
            c = int(key)
        except ValueError:
            raise PolicyError(f"classes.{key}: class must be a number 0..7") from None
        if not isinstance(spec, Mapping):
            raise PolicyError(f"classes.{key}: must be a table")
        _unknown(spec, _CLASS_KEYS, f"classes.{key}.")
        kw = {k: _int(v, f"classes.{key}.{k}") for k, v in spec.items()}
        out.append(ClassQueue(c, **kw))
    return tuple(sorted(out, key=lambda o: o.cls))


def policy_from_dict(data: Mapping[str, Any]) -> SwitchPolicy:
    """A validated policy from parsed TOML (defaults for every missing key)."""
    _unknown(data, _KEYS, "")
    kw: dict[str, Any] = {}
    for k in (
        "n_classes",
        "queue_packets",
        "drop_eligible_packets",
        "protected_weight",
        "mtu_bytes",
    ):
        if k in data:
            kw[k] = _int(data[k], k)
    if "link_rate_mbit" in data:
        rate = data["link_rate_mbit"]
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise PolicyError(f"link_rate_mbit: must be a number, got {rate!r}")
        kw["link_rate_mbit"] = float(rate)
    if "tos" in data:
        kw["tos"] = _tos(data["tos"])
    if "classes" in data:
        kw["classes"] = _classes(data["classes"])
    return SwitchPolicy(**kw)


def load_policy(path: str | os.PathLike[str] | None = None) -> SwitchPolicy:
    """Read a TOML policy file; ``None``: the default policy."""
    if path is None:
        return SwitchPolicy()
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise PolicyError(f"{p}: cannot read policy file: {e}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise PolicyError(f"{p}: not valid TOML (UTF-8): {e}") from e
    try:
        return policy_from_dict(data)
    except PolicyError as e:
        raise PolicyError(f"{p}: {e}") from e
