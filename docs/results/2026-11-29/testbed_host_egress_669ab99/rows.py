"""The Markdown rows of docs/testbed.md's host-egress tables, from a folder of run
JSONs: ``python rows.py FOLDER``. DLCP rows, then ``---``, then Gloo rows.

"resent %" is resent packets over the DLCP data packets (classes 1-6) the leaves
delivered to the hosts; router drops are drop-eligible / protected (DLCP) or all
(Gloo)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DATA_CLASSES = ("c1", "c2", "c3", "c4", "c5", "c6")


def delivered(run: dict[str, Any]) -> int:
    """DLCP data packets the leaves sent out of their host ports."""
    n = 0
    for router, devs in run["router_link_packets"].items():
        if router.startswith("leaf"):
            for dev, classes in devs.items():
                if dev.startswith("h"):
                    n += sum(v for k, v in classes.items() if k[:2] in DATA_CLASSES)
    return n


def row(path: Path) -> tuple[str, str, str, str]:
    run = json.loads(path.read_text())
    rnd = path.name.split("-")[0]
    epochs = run["train"]["epochs"]
    classes = run["router_classes"]
    eligible = sum(v["drops"] for k, v in classes.items() if k.endswith("-drop"))
    protected = sum(v["drops"] for k, v in classes.items() if not k.endswith("-drop"))
    hosts = run["setup"].get("host_egress") or "unshaped"
    per_epoch = ", ".join(f"{1e3 * e['iter_s']:.0f}" for e in epochs)
    ms = f"{run['median_ms_per_iter']:.1f} ({per_epoch})"
    scenario = run["scenario"]
    if run["transport"] != "dlcp":
        drops = eligible + protected
        return (
            "gloo",
            scenario,
            rnd + hosts,
            f"| {scenario}, Gloo | {rnd} | {hosts} | {drops:,} | {ms} |",
        )
    lost_epochs = ", ".join(f"{100 * e['loss_fraction']:.3f}" for e in epochs)
    lost = f"{100 * run['lost_fraction']:.3f} ({lost_epochs})"
    resent = run["retransmissions"]
    res = f"{resent:,} ({100 * resent / delivered(run):.2f})"
    cells = [scenario, rnd, hosts, lost, res, f"{eligible:,} / {protected:,}", ms]
    return ("dlcp", scenario, rnd + hosts, "| " + " | ".join(cells) + " |")


def main(folder: str) -> None:
    rows = sorted(row(p) for p in Path(folder).glob("*.json"))
    print("\n".join(r[-1] for r in rows if r[0] == "dlcp"))
    print("---")
    print("\n".join(r[-1] for r in rows if r[0] == "gloo"))


if __name__ == "__main__":
    main(sys.argv[1])
