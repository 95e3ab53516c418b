"""The table of this folder's README from runs/*.json (run from this folder)."""

import json
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
    print(
        f"{f.stem:12s} {d['median_ms_per_iter']:7.1f} ms  lost {100 * d['lost_fraction']:.3f} %"
        f"  resent {d['retransmissions']:6d}  to spine1/spine2: {', '.join(split)}"
        f"  CPU idle {d['cpu_idle_pct']} %"
    )
