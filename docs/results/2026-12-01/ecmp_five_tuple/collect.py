"""The table of this folder's README from runs/*.json (run from this folder)."""

import json
import re
from pathlib import Path

for f in sorted(Path("runs").glob("*.json")):
    d = json.loads(f.read_text())
    lp = d["router_link_packets"]
    split = []
    for leaf in ("leaf1", "leaf2"):
        up = [sum(lp[leaf][s].values()) for s in ("spine1", "spine2")]
        split.append(
            f"{leaf} {100 * up[0] / max(sum(up), 1):.0f}/{100 * up[1] / max(sum(up), 1):.0f}"
        )
    lost = "-" if d["lost_fraction"] is None else f"{100 * d['lost_fraction']:.3f} %"
    rule = re.search(r"loss-rule:(\d+)", d["router_drops"])
    drops = rule.group(1) if rule else "-"
    print(
        f"{f.stem:16s} {d['median_ms_per_iter']:7.1f} ms  lost {lost:>8s}"
        f"  resent {d['retransmissions'] or 0:6d}  loss-rule drops {drops:>5s}"
        f"  up to spine1/spine2: {', '.join(split)}  CPU idle {d['cpu_idle_pct']} %"
    )
