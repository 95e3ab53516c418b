"""The rows of docs/testbed.md's before/after table from the runs' JSON, in the order
of `runs.log` (the start time and 1-minute load average of each run).

    python table.py RUNS_DIR

"resent %" is resent packets over the DLCP data packets (classes 1-6) the leaves
delivered to the hosts; drops are the routers', DLCP classes 1-6, drop-eligible /
protected.
"""

import glob
import json
import sys
from pathlib import Path

runs = Path(sys.argv[1])
loads = {}
for line in (runs / "runs.log").read_text().splitlines():
    w = line.split()
    if w[1] == "start":
        loads[w[2]] = (w[0], w[w.index("load") + 1])
for label, (start, load) in loads.items():
    found = glob.glob(str(runs / label / "*.json"))
    if not found:
        continue
    with open(found[0]) as f:
        d = json.load(f)
    eps = d["train"]["epochs"]
    ms = f"{d['median_ms_per_iter']:.1f} ({', '.join(str(round(e['iter_s'] * 1000)) for e in eps)})"
    if d["transport"] != "dlcp":
        print(f"| {label} | {start}, {load} | {ms} | - | - | - |")
        continue
    delivered = sum(
        n
        for leaf, ports in d["router_link_packets"].items()
        for port, classes in ports.items()
        if port.startswith("h")
        for c, n in classes.items()
        if c[1] in "123456"
    )
    eligible = protected = 0
    for c, v in d["router_classes"].items():
        if c[:2] in ("c1", "c2", "c3", "c4", "c5", "c6"):
            if c.endswith("-drop"):
                eligible += v["drops"]
            else:
                protected += v["drops"]
    lost = ", ".join(f"{100 * e['loss_fraction']:.3f}" for e in eps)
    resent = d["retransmissions"]
    print(
        f"| {label} | {start}, {load} | {ms} | {100 * d['lost_fraction']:.3f} ({lost}) | "
        f"{resent:,} ({100 * resent / delivered:.2f}) | {eligible:,} / {protected:,} |"
    )
