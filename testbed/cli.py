"""``dlcp testbed up|down``: bring a leaf-spine testbed up and keep it, or remove
one left behind. ``dlcp testbed run|suite|plot``: training experiments on it
(:mod:`.experiments`).

``up`` builds the topology, optionally installs a switch profile on every router
egress, prints the namespaces and host addresses and a line ``ready``, then waits
until Ctrl-C or SIGTERM and removes everything it created (by name). ``down``
removes the namespaces ``<prefix><node>`` for exactly the nodes of a topology
file -- nothing else, no pattern matching.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from types import FrameType

from dlcp.errors import DLCPError, UsageError
from dlcp.processes import sigterm_interrupts
from dlcp.switch.policy import PolicyError

from .backend import backend_class
from .bmv2 import Bmv2Error
from .host_egress import HOST_EGRESS_MODES
from .netns import NetnsError, _cleanup, _run, prefix_lock
from .switch_profile import FifoPolicy, SwitchPolicy
from .topology import DEFAULT_TOPOLOGY, Topology, TopologyError

DEFAULT_PREFIX = "dlcptb-"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``testbed`` subcommand (with ``up`` and ``down``) to ``sub``."""
    tb = sub.add_parser("testbed", help="leaf-spine testbed of network namespaces (root)")
    tsub = tb.add_subparsers(dest="testbed_command", required=True)
    up = tsub.add_parser("up", help="build the testbed and keep it until Ctrl-C/SIGTERM")
    up.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), help="TOML topology file")
    up.add_argument(
        "--profile",
        choices=["dlcp", "fifo", "none"],
        default="dlcp",
        help="switch profile on every router egress (default dlcp)",
    )
    up.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"namespace prefix ({DEFAULT_PREFIX})")
    up.add_argument(
        "--backend",
        choices=["namespaces", "mininet"],
        default="namespaces",
        help="plain network namespaces (default) or Mininet nodes (testbed/mininet_backend.py)",
    )
    up.add_argument(
        "--switch",
        choices=["linux", "bmv2"],
        default="linux",
        help="routers forward with Linux (default) or run BMv2 simple_switch_grpc with the "
        "DLCP P4 program, configured over P4Runtime (needs the p4lang binaries)",
    )
    up.add_argument(
        "--host-egress", choices=HOST_EGRESS_MODES, default=None, help=_HOST_EGRESS_HELP
    )
    up.add_argument(
        "--cli",
        action="store_true",
        help="with --backend mininet: open Mininet's CLI (h1 ping h4); exit removes the testbed",
    )
    down = tsub.add_parser("down", help="remove the namespaces of a testbed by name")
    down.add_argument("--topology", default=str(DEFAULT_TOPOLOGY), help="TOML topology file")
    down.add_argument(
        "--prefix", default=DEFAULT_PREFIX, help=f"namespace prefix ({DEFAULT_PREFIX})"
    )
    _add_experiment_parsers(tsub)


_SWITCH_HELP = (
    "routers: Linux forwarding + tc profile (default), or BMv2 simple_switch_grpc with the "
    "DLCP P4 program over P4Runtime (functional numbers, not performance)"
)


_BACKEND_HELP = (
    "Linux routers in plain network namespaces (default) or Mininet nodes "
    "(testbed/mininet_backend.py)"
)


_HOST_EGRESS_HELP = (
    "the hosts' own egress: shaped, serialised at the link rate as a NIC does (default "
    "with Linux routers), or unshaped, written into the leaf at memory speed (BMv2: "
    "unshaped only)"
)


_HIDDEN_HELP = (
    "units of the model's hidden layer (default 64: ~38k parameters; 1024: ~540k, "
    "a gradient that outweighs the computation)"
)
_LINK_RATE_HELP = (
    "every Linux router egress is shaped to this many Mbit/s (default 200; at 50 the "
    "links, not the CPU, should limit the runs)"
)


def _link_rate(text: str) -> float:
    """``--link-rate``: a positive, finite number of Mbit/s."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of Mbit/s") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of Mbit/s, got {text}")
    return value


_MTU_HELP = (
    "every link's MTU in bytes (default 1500; 9000: jumbo frames); DLCP's datagrams "
    "follow it (DLCP_MTU=auto)"
)


def _add_experiment_parsers(tsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .experiments import ABLATIONS, BACKENDS, SCENARIOS

    run = tsub.add_parser(
        "run", help="train on the testbed under one scenario (see testbed/experiments.py)"
    )
    run.add_argument(
        "--scenario", choices=SCENARIOS, required=True, help="network conditions to train under"
    )
    run.add_argument(
        "--transport", choices=["dlcp", "gloo"], required=True, help="how gradients travel"
    )
    run.add_argument(
        "--ablate",
        default="",
        help=f"DLCP features to turn off, comma-separated: {','.join(ABLATIONS)}",
    )
    run.add_argument("--epochs", type=int, default=2, help="training epochs (default 2)")
    run.add_argument("--batch-size", type=int, default=16, help="per rank (default 16)")
    run.add_argument("--hidden", type=int, default=64, help=_HIDDEN_HELP)
    run.add_argument("--link-rate", type=_link_rate, default=None, help=_LINK_RATE_HELP)
    run.add_argument("--mtu", type=int, default=1500, help=_MTU_HELP)
    run.add_argument("--results", default="results", help="results folder (default results)")
    run.add_argument("--prefix", default=None, help="namespace prefix (default: unique)")
    run.add_argument("--switch", choices=["linux", "bmv2"], default="linux", help=_SWITCH_HELP)
    run.add_argument("--backend", choices=BACKENDS, default="namespaces", help=_BACKEND_HELP)
    run.add_argument(
        "--host-egress", choices=HOST_EGRESS_MODES, default=None, help=_HOST_EGRESS_HELP
    )
    run.add_argument(
        "--profile",
        choices=["dlcp", "fifo"],
        default=None,
        help="Linux routers' queueing: the DLCP switch profile or one FIFO (default: dlcp "
        "for DLCP, fifo for Gloo, as a network without DLCP's configuration)",
    )
    suite = tsub.add_parser("suite", help="every scenario for Gloo and DLCP, then a table")
    suite.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma-separated (default: all)"
    )
    suite.add_argument("--epochs", type=int, default=2, help="epochs of each run (default 2)")
    suite.add_argument(
        "--ablations-on",
        default=None,
        metavar="SCENARIOS",
        help="also run each DLCP ablation on these scenarios (comma-separated, or 'all')",
    )
    suite.add_argument("--hidden", type=int, default=64, help=_HIDDEN_HELP)
    suite.add_argument("--mtu", type=int, default=1500, help=_MTU_HELP)
    suite.add_argument("--link-rate", type=_link_rate, default=None, help=_LINK_RATE_HELP)
    suite.add_argument("--results", default="results", help="results folder (default results)")
    suite.add_argument("--switch", choices=["linux", "bmv2"], default="linux", help=_SWITCH_HELP)
    suite.add_argument("--backend", choices=BACKENDS, default="namespaces", help=_BACKEND_HELP)
    suite.add_argument(
        "--host-egress", choices=HOST_EGRESS_MODES, default=None, help=_HOST_EGRESS_HELP
    )
    suite.add_argument(
        "--gloo-profile",
        choices=["dlcp", "fifo"],
        default=None,
        help="Gloo's runs over Linux routers: one FIFO (default) or the DLCP profile",
    )
    plot = tsub.add_parser("plot", help="bar plot (PNG) and table of <results>/testbed.csv")
    plot.add_argument("--results", default="results", help="results folder (default results)")


def _policy(name: str, t: Topology) -> SwitchPolicy | FifoPolicy | None:
    if name == "dlcp":
        return SwitchPolicy.for_link(t.link_rate_mbit, t.buffer_packets)
    if name == "fifo":
        return FifoPolicy(link_rate_mbit=t.link_rate_mbit, queue_packets=t.buffer_packets)
    return None


class _Stop(DLCPError):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def up(
    topology: str,
    profile: str,
    prefix: str,
    backend: str = "namespaces",
    cli: bool = False,
    switch: str = "linux",
    host_egress: str | None = None,
) -> int:
    t = Topology.load(topology)
    policy = _policy(profile, t)
    if cli and backend != "mininet":
        print("dlcp testbed up: --cli needs --backend mininet", file=sys.stderr)
        return 2
    if switch == "bmv2" and backend != "namespaces":
        print("dlcp testbed up: --switch bmv2 needs --backend namespaces", file=sys.stderr)
        return 2
    if switch == "bmv2" and not isinstance(policy, SwitchPolicy):
        print(
            f"dlcp testbed up: --switch bmv2 runs the DLCP policy in the P4 switches; "
            f"--profile {profile} is not available with it (use --profile dlcp)",
            file=sys.stderr,
        )
        return 2
    try:
        testbed = backend_class(switch, backend)(t, policy, prefix=prefix, host_egress=host_egress)
    except UsageError as e:
        print(f"dlcp testbed up: {e}", file=sys.stderr)
        return 2
    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with testbed.build() as net:
            print(
                f"testbed {t.name}: prefix {prefix}, profile {profile}, switch {switch}, "
                f"hosts {testbed.host_egress}"
            )
            switches = getattr(net, "switches", {})
            for node in t.nodes:
                addr = f"  {net.host_addr(node)}" if node in t.host_names else ""
                sw = switches.get(node)
                if sw is not None:
                    addr = (
                        f"  BMv2 device {sw.device_id}, P4Runtime {sw.grpc_addr}, "
                        f"thrift {sw.thrift_port} (in the netns)"
                    )
                print(f"  {node:<16} netns {net.ns(node)}{addr}")
            print(f"enter a host: ip netns exec {net.ns(t.host_names[0])} bash")
            if backend == "mininet":
                print(f"Mininet nodes: {' '.join(t.nodes)} (no switches, no controller)")
            print("ready", flush=True)
            if cli:
                # Ctrl-C inside the CLI interrupts a command, as in Mininet itself
                signal.signal(signal.SIGINT, signal.default_int_handler)
                testbed.open_cli()
            while not cli:
                signal.pause()
    except _Stop:
        pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    print("testbed removed", flush=True)
    return 0


def down(topology: str, prefix: str) -> int:
    """Remove what a crashed run left under ``prefix``; refused while a live
    testbed holds the prefix (its processes would be killed under it)."""
    t = Topology.load(topology)
    names = [f"{prefix}{n}" for n in t.nodes]

    def present() -> list[str]:
        listed = set(_run(["ip", "netns", "list"]).stdout.split())
        return [n for n in names if n in listed]

    with prefix_lock(prefix):
        gone = present()
        _cleanup(gone)
        left = present()
    if left:
        raise NetnsError(f"could not remove namespaces {' '.join(left)}")
    print(f"removed {len(gone)} namespaces" + (f": {' '.join(gone)}" if gone else ""))
    return 0


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _experiments(args: argparse.Namespace) -> int:
    from . import experiments as ex
    from .results import table

    if args.testbed_command == "plot":
        rows = ex.read_csv(args.results)
        path = ex.plot(args.results)
        if path is None:
            print(f"dlcp testbed plot: no {args.results}/{ex.CSV_NAME}", file=sys.stderr)
            return 1
        print(table(rows))
        print(f"plot: {path}")
        return 0
    if args.testbed_command == "suite":
        ablated = (
            []
            if args.ablations_on is None
            else list(ex.SCENARIOS)
            if args.ablations_on == "all"
            else _split(args.ablations_on)
        )
        bad = [s for s in (*_split(args.scenarios), *ablated) if s not in ex.SCENARIOS]
        if bad:
            print(f"dlcp testbed suite: unknown scenario {bad[0]!r}", file=sys.stderr)
            return 2
        try:
            failures, _rows = ex.suite(
                _split(args.scenarios),
                epochs=args.epochs,
                results=args.results,
                ablation_scenarios=ablated,
                switch=args.switch,
                gloo_profile=args.gloo_profile,
                hidden=args.hidden,
                backend=args.backend,
                mtu=args.mtu,
                host_egress=args.host_egress,
                **({} if args.link_rate is None else {"link_rate_mbit": args.link_rate}),
            )
        except ValueError as e:  # refused before any run
            print(f"dlcp testbed suite: {e}", file=sys.stderr)
            return 2
        return 1 if failures else 0
    try:
        config = ex.ExperimentConfig(
            args.scenario,
            args.transport,
            ablate=tuple(_split(args.ablate)),
            epochs=args.epochs,
            batch_size=args.batch_size,
            hidden=args.hidden,
            mtu=args.mtu,
            results=args.results,
            prefix=args.prefix,
            switch=args.switch,
            backend=args.backend,
            profile=args.profile,
            host_egress=args.host_egress,
            **({} if args.link_rate is None else {"link_rate_mbit": args.link_rate}),
        )
    except ValueError as e:
        print(f"dlcp testbed run: {e}", file=sys.stderr)
        return 2
    try:
        ex.run_experiment(config)
    except ValueError as e:
        print(f"dlcp testbed run: {e}", file=sys.stderr)
        return 2
    except ex.ExperimentError as e:
        print(f"dlcp testbed run: {e}", file=sys.stderr)
        return 1
    return 0


def main(args: argparse.Namespace) -> int:
    try:
        if args.testbed_command == "up":
            return up(
                args.topology, args.profile, args.prefix, args.backend, args.cli, args.switch,
                args.host_egress,
            )
        if args.testbed_command == "down":
            return down(args.topology, args.prefix)
        if args.testbed_command in ("run", "suite", "plot"):
            try:  # (SIGTERM too: every run's finally removes its testbed)
                with sigterm_interrupts():
                    return _experiments(args)
            except KeyboardInterrupt:
                print(f"dlcp testbed {args.testbed_command}: interrupted (testbed removed)",
                      file=sys.stderr)  # fmt: skip
                return 130
    except (NetnsError, TopologyError, Bmv2Error, PolicyError) as e:
        print(f"dlcp testbed: {e}", file=sys.stderr)
        return 1
    print(f"unknown testbed command {args.testbed_command}", file=sys.stderr)
    return 2
