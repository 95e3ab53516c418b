"""Render a :class:`~dlcp.switch.policy.SwitchPolicy` as a SONiC ``config_db`` QoS
fragment (the JSON that ``config load`` / ``sonic-cfggen --write-to-db`` takes).

Tables (names and fields as SONiC's orchagent reads them):

* ``DSCP_TO_TC_MAP|DLCP``: each class's DSCP to traffic class ``queue_of(c)``; every
  other DSCP to TC 0 (best effort), listed explicitly so no platform default applies;
* ``TC_TO_QUEUE_MAP|DLCP``: TC ``q`` to queue ``q``;
* ``SCHEDULER|DLCP_SP_Q<q>``: ``type`` ``STRICT`` with ``priority`` ``q`` -- strict
  priority, meant to serve the higher queue (the more urgent DLCP class) first.
  The order among strict queues is the ASIC's own (orchagent is reported to
  ignore ``priority``; not checked here): check that the platform serves the
  higher queue first;
* ``WRED_PROFILE|DLCP_C<c>``: ECN marking on (``ecn_all``). ECT packets -- DLCP's
  protected ones (ECT(0)) -- are *marked* above the thresholds and keep queueing up
  to the queue's buffer limit; Not-ECT packets -- the drop-eligible ones -- are
  *dropped* from ``drop_threshold(c)`` packets on (min) to one MTU more (max, 100 %
  drop). Green, yellow and red get the same thresholds, so a policer's colours do
  not change which packets go first; the ECN codepoint does;
* ``BUFFER_PROFILE|DLCP_Q<q>``: the queue limit ``queue_limit(c)`` as a static
  threshold in ``egress_lossy_pool`` (that pool must exist, as on stock SONiC);
* ``QUEUE|<port>|<q>``: scheduler and WRED profile per port and queue;
  ``BUFFER_QUEUE|<port>|<q>``: the buffer profile;
* ``PORT_QOS_MAP|<port>``: the DSCP-to-TC and TC-to-queue maps.

Byte values are packets times ``policy.mtu_bytes``. All values are strings, as in
``config_db.json``.

Known gap: WRED sees the ECN codepoint, not the protocol. DLCP's TCP control
channel carries class 7's DSCP, and a TCP socket's packets leave Not-ECT (the
kernel sets their ECN bits), so on such a switch they count as class 7's
drop-eligible packets and are dropped first under a standing queue (TCP then
resends them). The Linux tc profile and the P4 program exempt them (tc: only
UDP is drop-eligible; P4: only packets it parses as DLCP data are).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .policy import PolicyError, SwitchPolicy

__all__ = ["MAP_NAME", "sonic_config"]

MAP_NAME = "DLCP"
_POOL = "egress_lossy_pool"


def _check_ports(ports: Sequence[str]) -> None:
    if not ports:
        raise PolicyError("ports: at least one port name is needed (e.g. Ethernet0)")
    for p in ports:
        if not p or "|" in p or "," in p or p != p.strip():
            raise PolicyError(f"ports: invalid port name {p!r}")
    if len(set(ports)) != len(ports):
        raise PolicyError(f"ports: duplicate port names in {list(ports)}")


_INT32_MAX = 2**31 - 1


def sonic_config(policy: SwitchPolicy, ports: Sequence[str] = ("Ethernet0",)) -> dict[str, Any]:
    """The QoS tables of ``policy`` applied to ``ports``.

    Drop-eligibility is WRED with ``ecn: ecn_all``: ECN-capable packets are
    marked, Not-ECT ones dropped. That is the policy's TOS map only when its
    drop-eligible packets are Not-ECT and its protected ones ECN-capable; any
    other map is refused rather than rendered into its opposite."""
    _check_ports(ports)
    if policy.tos.ecn_droppable != 0 or policy.tos.ecn_protected == 0:
        raise PolicyError(
            "tos: the SONiC rendering (WRED, ecn_all) drops Not-ECT packets and marks "
            "ECN-capable ones, so it needs ecn_droppable = 0 (Not-ECT) and an ECN-capable "
            f"ecn_protected; got ecn_droppable={policy.tos.ecn_droppable}, "
            f"ecn_protected={policy.tos.ecn_protected}"
        )
    classes = range(policy.n_classes)
    queue_class = {policy.queue_of(c): c for c in classes}
    dscp_tc = {str(d): "0" for d in range(64)}
    for c in policy.marked_classes():  # (those above the policy's: its top queue)
        dscp_tc[str(policy.tos.dscp[c])] = str(policy.queue_of(c))
    queues = sorted(queue_class)

    for c in classes:  # (orchagent reads byte counts as 32-bit integers)
        if (policy.queue_limit(c) + 1) * policy.mtu_bytes > _INT32_MAX:
            raise PolicyError(
                f"class {c}: {policy.queue_limit(c)} packets of {policy.mtu_bytes} bytes "
                f"exceed the {_INT32_MAX} bytes a SONiC threshold holds"
            )
    wred: dict[str, dict[str, str]] = {}
    for c in classes:
        lo = policy.drop_threshold(c) * policy.mtu_bytes
        hi = lo + policy.mtu_bytes
        profile = {"ecn": "ecn_all"}
        for colour in ("green", "yellow", "red"):
            profile[f"wred_{colour}_enable"] = "true"
            profile[f"{colour}_min_threshold"] = str(lo)
            profile[f"{colour}_max_threshold"] = str(hi)
            profile[f"{colour}_drop_probability"] = "100"
        wred[f"DLCP_C{c}"] = dict(sorted(profile.items()))

    out: dict[str, Any] = {
        "DSCP_TO_TC_MAP": {MAP_NAME: dict(sorted(dscp_tc.items(), key=lambda kv: int(kv[0])))},
        "TC_TO_QUEUE_MAP": {MAP_NAME: {str(q): str(q) for q in queues}},
        "SCHEDULER": {f"DLCP_SP_Q{q}": {"type": "STRICT", "priority": str(q)} for q in queues},
        "WRED_PROFILE": wred,
        "BUFFER_PROFILE": {
            f"DLCP_Q{q}": {
                "pool": _POOL,
                "size": "0",
                "static_th": str(policy.queue_limit(queue_class[q]) * policy.mtu_bytes),
            }
            for q in queues
        },
        "QUEUE": {
            f"{p}|{q}": {"scheduler": f"DLCP_SP_Q{q}", "wred_profile": f"DLCP_C{queue_class[q]}"}
            for p in ports
            for q in queues
        },
        "BUFFER_QUEUE": {f"{p}|{q}": {"profile": f"DLCP_Q{q}"} for p in ports for q in queues},
        "PORT_QOS_MAP": {
            p: {"dscp_to_tc_map": MAP_NAME, "tc_to_queue_map": MAP_NAME} for p in ports
        },
    }
    return out
