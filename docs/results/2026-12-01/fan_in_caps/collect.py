"""Gathers the testbed runs of this folder into runs.json: one entry a run.

    python3 collect.py /tmp/share > runs.json

reads every ``<tag>_<A|B>_<round>/*-dlcp*.json`` that ``abenv.sh`` left under the
directory given, and keeps what the README's tables use: the time an iteration, the
gradient values lost, the packets resent, the routers' drops by port and the CPU's
idle share. ``setting`` is A or B of ``abenv.sh`` (the trial's variable: see
README.md for what each tag compared).
"""

from __future__ import annotations

import glob
import json
import os
import sys


def main(root: str) -> None:
    runs = []
    for path in sorted(glob.glob(os.path.join(root, "*_*_*", "*-dlcp*.json"))):
        tag, setting, rnd = os.path.basename(os.path.dirname(path)).rsplit("_", 2)
        with open(path) as f:
            d = json.load(f)
        drops = {
            f"{router}>{port}": sum(classes.values())
            for router, ports in d["router_link_drops"].items()
            for port, classes in ports.items()
            if sum(classes.values())
        }
        runs.append({
            "tag": tag, "setting": setting, "round": int(rnd),
            "scenario": d["scenario"], "collective": d["train"]["collective"],
            "link_rate_mbit": d["link_rate_mbit"], "code_rev": d["code_rev"],
            "ms_per_iter": round(d["median_ms_per_iter"], 1),
            "lost_fraction": d["lost_fraction"], "resent": d["retransmissions"],
            "router_drops_by_port": drops, "cpu_idle_pct": d["cpu_idle_pct"],
            "finished_utc": d["finished_utc"],
        })  # fmt: skip
    json.dump(runs, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
