"""The table of this folder's README from runs/*.json (run from this folder)."""

import json
import re
from pathlib import Path

for f in sorted(Path("runs").glob("*.json")):
    d = json.loads(f.read_text())
    lp = d["router_link_packets"]
    up = (sum(lp["leaf1"]["spine1"].values()), sum(lp["leaf1"]["spine2"].values()))
    down = sum(lp["spine1"]["leaf1"].values())
    rule = re.search(r"loss-rule:(\d+)", d["router_drops"])
    print(
        f"{f.stem:14s} {d['median_ms_per_iter']:7.1f} ms  lost {100 * d['lost_fraction']:.3f} %"
        f"  resent {d['retransmissions']:5d}  loss-rule drops {rule.group(1) if rule else '-'}"
        f"  leaf1->spine1/spine2 {up}  spine1->leaf1 {down}  CPU idle {d['cpu_idle_pct']} %"
    )
