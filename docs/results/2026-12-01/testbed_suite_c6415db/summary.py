"""DLCP / Gloo per scenario of this folder's suite runs (run from this folder):
ms per iteration, DLCP's values lost and packets resent, both transports' CPU seconds
and the machine's idle share, and how leaf1's packets split over the two spines."""

import json
from pathlib import Path


def leaf1_split(run: dict) -> str:
    lp = run["router_link_packets"]
    up = [sum(lp["leaf1"][s].values()) for s in ("spine1", "spine2")]
    total = max(sum(up), 1)
    return f"{100 * up[0] / total:.0f}/{100 * up[1] / total:.0f}"


for rate in ("200mbit", "50mbit"):
    runs = {}
    for f in Path(rate).glob("*.json"):
        j = json.loads(f.read_text())
        runs[j["scenario"], j["transport"]] = j
    for scenario in ("clean", "loss", "background", "spine-down", "incast"):
        g, x = runs[scenario, "gloo"], runs[scenario, "dlcp"]
        dlcp_ms, gloo_ms = x["median_ms_per_iter"], g["median_ms_per_iter"]
        print(
            f"{rate} {scenario:10s} DLCP {dlcp_ms:7.1f} Gloo {gloo_ms:7.1f}"
            f" ratio {dlcp_ms / gloo_ms:.3f} lost {100 * (x['lost_fraction'] or 0):.3f} %"
            f" resent {x['retransmissions']} CPU s {x['ranks_cpu_s']} / {g['ranks_cpu_s']}"
            f" idle {x['cpu_idle_pct']} / {g['cpu_idle_pct']} %"
            f" leaf1 up DLCP {leaf1_split(x)} Gloo {leaf1_split(g)}"
        )
