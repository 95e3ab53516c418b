"""``dlcp sim run`` and ``dlcp sim suite``: the command line of the ns-3 simulation."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .config import ABLATIONS, TRANSPORTS, WORKLOADS, SimConfig, SimConfigError
from .plots import plot_fct_cdf, plot_iteration_bars
from .results import write_json, write_summary_csv
from .runner import SimError, run_many

__all__ = ["add_parser", "main", "suite_configs"]


def default_hosts_per_leaf(hosts: int) -> int:
    """Hosts per leaf when none is given: 16 (the 144-host fabric's), or the largest
    number below that which fills at least two whole leaves with ``hosts``."""
    top = max(1, min(16, hosts // 2))
    return next(d for d in range(top, 0, -1) if hosts % d == 0)


def default_servers(hosts: int) -> int:
    """Parameter servers when none is given: one per 9 hosts (16 of 144), at least 1."""
    return max(1, hosts // 9)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", type=int, default=144, help="hosts (default 144)")
    p.add_argument("--topology", default=None,
                   help="leaf-spine TOML, testbed format: its hosts, leaves and spines "
                        "(rates and buffers come from --link-gbps and --buffer-packets; "
                        "default: a regular one)")  # fmt: skip
    p.add_argument("--hosts-per-leaf", type=int, default=None,
                   help="hosts under each leaf (default 16, or fewer so that --hosts fills "
                        "at least two whole leaves)")  # fmt: skip
    p.add_argument("--spines", type=int, default=4, help="spine switches (default 4)")
    p.add_argument(
        "--link-gbps", type=float, default=100.0, help="every link's rate (default 100 Gbit/s)"
    )
    p.add_argument(
        "--oversubscription",
        type=float,
        default=None,
        help="leaf downlink:uplink capacity (default: spine links at link rate)",
    )
    p.add_argument("--buffer-packets", type=int, default=300, help="per switch port")
    p.add_argument("--servers", type=int, default=None,
                   help="parameter servers of a ps-* workload (default one per 9 hosts, "
                        "16 of 144)")  # fmt: skip
    p.add_argument("--iterations", type=int, default=2, help="training iterations (default 2)")
    p.add_argument(
        "--scale", type=float, default=0.01, help="gradient bytes multiplied by this (default 0.01)"
    )
    p.add_argument("--p", type=float, default=0.1, help="DLCP loss bound of gradients")
    p.add_argument("--background-flows", type=int, default=0, help="per host")
    p.add_argument("--tcp-min-rto-us", type=float, default=1000.0,
                   help="TCP/DCTCP minimum RTO (default 1000 us)")  # fmt: skip
    p.add_argument("--seed", type=int, default=1, help="seed of every random choice (default 1)")
    p.add_argument("--jobs", type=int, default=1, help="simulations run at once")
    p.add_argument("--out", default="results/sim", help="output directory")  # fmt: skip


def add_parser(sub: Any) -> None:
    sim = sub.add_parser("sim", help="large-scale ns-3 simulation (needs dlcp[sim])")
    ssub = sim.add_subparsers(dest="sim_command", required=True)
    run = ssub.add_parser("run", help="one workload over one transport")
    _common(run)
    run.add_argument("--workload", default="ps-resnet50", help=", ".join(WORKLOADS))
    run.add_argument("--transport", default="dlcp", help=", ".join(TRANSPORTS))
    run.add_argument("--disable", action="append", default=[],
                     help=f"turn a DLCP mechanism off ({', '.join(ABLATIONS)}); "
                     "repeatable")  # fmt: skip
    suite = ssub.add_parser("suite", help="DLCP, TCP, DCTCP and DLCP ablations")
    _common(suite)
    suite.add_argument("--workload", action="append", default=[],
                       help="repeatable (default ps-resnet50)")  # fmt: skip
    suite.add_argument(
        "--no-ablations", action="store_true", help="run DLCP, TCP and DCTCP only"
    )


def _base(args: argparse.Namespace, workload: str) -> dict[str, Any]:
    return {
        "hosts": args.hosts,
        "topology": args.topology,
        "hosts_per_leaf": (
            default_hosts_per_leaf(args.hosts)
            if args.hosts_per_leaf is None
            else args.hosts_per_leaf
        ),
        "spines": args.spines,
        "link_gbps": args.link_gbps,
        "oversubscription": args.oversubscription,
        "buffer_packets": args.buffer_packets,
        "servers": default_servers(args.hosts) if args.servers is None else args.servers,
        "iterations": args.iterations,
        "scale": args.scale,
        "p": args.p,
        "background_flows": args.background_flows,
        "tcp_min_rto_us": args.tcp_min_rto_us,
        "seed": args.seed,
        "workload": workload,
    }


def suite_configs(base: dict[str, Any], workloads: list[str], ablations: bool) -> list[SimConfig]:
    out = []
    for w in workloads:
        for t in ("dlcp", "dctcp", "tcp"):
            out.append(SimConfig(**{**base, "workload": w, "transport": t}))
        if ablations:
            for mech in ABLATIONS:
                out.append(SimConfig(**{**base, "workload": w, "disable": (mech,)}))
    return out


def _relative(rows: list[dict[str, Any]]) -> None:
    """Print the table; changes are relative to DCTCP on the same workload."""
    ref = {r["workload"]: r for r in rows if r["label"] == "dctcp"}
    print(f"{'workload':<14} {'transport':<22} {'mean FCT us':>12} {'p99 FCT us':>11} "
          f"{'iter us':>9} {'loss %':>7} {'vs DCTCP mean/p99':>19}")  # fmt: skip
    for r in rows:
        d = ref.get(r["workload"])
        rel = ""
        if d and r is not d:
            rel = (f"{100 * (r['fct_mean_us'] / d['fct_mean_us'] - 1):+.0f}% / "
                   f"{100 * (r['fct_p99_us'] / d['fct_p99_us'] - 1):+.0f}%")  # fmt: skip
        print(f"{r['workload']:<14} {r['label']:<22} {r['fct_mean_us']:>12.1f} "
              f"{r['fct_p99_us']:>11.1f} {r['iteration_mean_us']:>9.1f} "
              f"{100 * r['loss_fraction']:>7.2f} {rel:>19}")  # fmt: skip
        if r["failed"]:
            print(f"  WARNING: {r['failed']} of {r['messages']} messages of {r['label']} "
                  "failed (the sender gave up); not in the figures")  # fmt: skip
        if r["completed"] + r["failed"] < r["messages"]:
            missing = r["messages"] - r["completed"] - r["failed"]
            limit = r["config"]["time_limit_s"]
            print(f"  WARNING: {missing} of {r['messages']} messages of {r['label']} never "
                  f"completed (time limit {limit:g} s simulated); not in the figures")  # fmt: skip


def _write(rows: list[dict[str, Any]], out: Path, title: str) -> None:
    write_json(rows, out / "summary.json")
    write_summary_csv(rows, out / "summary.csv")
    for w in sorted({r["workload"] for r in rows}):
        mine = [r for r in rows if r["workload"] == w]
        fcts = {}
        for r in mine:
            data = json.loads((out / f"{r['name']}.result.json").read_text())
            fcts[r["label"]] = data["fct_us"]
        plot_fct_cdf(fcts, out / f"{w}_fct_cdf.png", f"{w}: {title}")
        plot_iteration_bars(mine, out / f"{w}_bars.png", f"{w}: {title}")


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        if args.sim_command == "run":
            configs = [SimConfig(**_base(args, args.workload), transport=args.transport,
                                 disable=tuple(args.disable))]  # fmt: skip
        else:
            configs = suite_configs(_base(args, ""), args.workload or ["ps-resnet50"],
                                    not args.no_ablations)  # fmt: skip
    except SimConfigError as e:
        print(f"dlcp sim: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        rows = run_many(configs, out, jobs=args.jobs, progress=lambda m: print(m, flush=True))
    except SimConfigError as e:  # (the same run asked for twice)
        print(f"dlcp sim: {e}", file=sys.stderr)
        return 2
    except SimError as e:
        print(f"dlcp sim: {e}", file=sys.stderr)
        return 1
    c = configs[0]
    title = (f"{c.hosts} hosts, {c.link_gbps:g} Gbit/s, oversubscription "
             f"{c.effective_oversubscription:g}, scale {c.scale:g}")  # fmt: skip
    _write(rows, out, title)
    _relative(rows)
    print(f"{title}; wall time {time.monotonic() - t0:.0f} s; results in {out}/")
    return 0
