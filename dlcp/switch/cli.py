"""``dlcp switch config``: print one policy's configuration for a target.

* ``--target bmv2``: the P4Runtime entries of every switch of the topology (or of
  ``--switch``), with ports and BMv2 queue depths; JSON, or ``--format text``;
* ``--target linux``: the ``tc`` commands of the namespace testbed's profile, for
  ``--dev`` or for every interface of every switch of the topology;
* ``--target sonic``: a SONiC ``config_db`` QoS fragment for ``--ports``.

The policy is ``--policy FILE`` (TOML, :mod:`dlcp.switch.policy`); without it, the
testbed's policy for the topology's link rate and buffer size.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import TYPE_CHECKING

from .policy import PolicyError, SwitchPolicy, load_policy, on_link

if TYPE_CHECKING:
    from testbed.topology import Topology

TARGETS = ("bmv2", "linux", "sonic")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``switch`` (with ``config``) to the ``dlcp`` subcommands."""
    sw = sub.add_parser("switch", help="switch configuration from one DLCP policy")
    ssub = sw.add_subparsers(dest="switch_command", required=True)
    cfg = ssub.add_parser("config", help="print the configuration for a target")
    cfg.add_argument(
        "--target",
        choices=TARGETS,
        required=True,
        help="bmv2: P4Runtime entries; linux: tc commands; sonic: config_db QoS JSON",
    )
    cfg.add_argument("--policy", help="TOML policy file (default: the testbed's policy)")
    cfg.add_argument("--topology", help="TOML topology file (default: leaf_spine_4h)")
    cfg.add_argument("--switch", help="only this switch of the topology (bmv2, linux)")
    cfg.add_argument("--dev", help="linux: one interface name instead of the topology's")
    cfg.add_argument(
        "--ports", default="Ethernet0", help="sonic: comma-separated ports (default Ethernet0)"
    )
    cfg.add_argument(
        "--format", choices=["json", "text"], default="json", help="bmv2 output (default json)"
    )


def _topology(path: str | None) -> Topology:
    # the topology format is the testbed's: imported when a command needs it, so that
    # importing dlcp.switch does not import the testbed
    from testbed.topology import Topology

    return Topology.load(path) if path else Topology.default()


def _switches(t: Topology, only: str | None) -> list[str]:
    switches = [*t.leaves, *t.spines]
    if only is None:
        return switches
    if only not in switches:
        raise PolicyError(f"--switch {only}: not a switch of {t.name} ({', '.join(switches)})")
    return [only]


def render(args: argparse.Namespace) -> str:
    """The text ``dlcp switch config`` prints for ``args``."""
    needs_topology = args.target == "bmv2" or (args.target == "linux" and not args.dev)
    t = _topology(args.topology) if needs_topology or not args.policy else None
    if args.policy:
        policy = load_policy(args.policy)
    else:
        assert t is not None  # loaded above when no policy is given
        policy = SwitchPolicy.for_link(t.link_rate_mbit, t.buffer_packets)
    if args.target == "sonic":
        from .sonic import sonic_config

        ports = [p.strip() for p in args.ports.split(",")]
        return json.dumps(sonic_config(policy, ports), indent=2)
    if args.target == "linux":
        from .linux_tc import tc_commands

        if args.dev:
            return "\n".join(shlex.join(c) for c in tc_commands(policy, args.dev))
        assert t is not None  # needs_topology
        lines = []
        for node in _switches(t, args.switch):
            for dev in _neighbours(t, node):
                spec = t.link_spec(node, dev)  # a link with a rate or buffer of its own
                if spec is not None:
                    mine = on_link(policy, spec.link_rate_mbit, spec.buffer_packets)
                else:
                    mine = policy
                lines.append(f"# {node}: egress {dev}")
                lines += [shlex.join(c) for c in tc_commands(mine, dev)]
        return "\n".join(lines)
    from .controller import fabric_config

    assert t is not None  # needs_topology
    configs = fabric_config(t, policy)
    chosen = _switches(t, args.switch)
    if args.format == "text":
        lines = []
        for node in chosen:
            c = configs[node]
            port_list = ", ".join(f"{n}={p}" for n, p in c.ports.items())
            lines.append(f"# {node}: ports {port_list}; queue depths {c.queue_depths}")
            lines += [e.describe() for e in c.entries]
        return "\n".join(lines)
    return json.dumps({n: configs[n].to_json() for n in chosen}, indent=2)


def _neighbours(t: Topology, node: str) -> list[str]:
    from .controller import switch_ports

    return list(switch_ports(t, node))


def main(args: argparse.Namespace) -> int:
    from testbed.topology import TopologyError

    try:
        print(render(args))
    except (PolicyError, TopologyError) as e:
        print(f"dlcp switch: {e}", file=sys.stderr)
        return 2
    return 0
