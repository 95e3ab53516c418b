"""The figures of runs/*.json: time, values lost, packets resent, leaf1's DLCP packets
over its two uplinks, and the routers' drops by place (leaf1 and leaf2's ports)."""

import glob
import json
from pathlib import Path


def total(x):
    return sum(total(v) for v in x.values()) if isinstance(x, dict) else (x or 0)


for path in sorted(glob.glob(str(Path(__file__).parent / "runs" / "*.json"))):
    d = json.loads(Path(path).read_text())
    up = d["router_link_packets"]["leaf1"]
    s1, s2 = total(up.get("spine1")), total(up.get("spine2"))
    drops = d.get("router_link_drops") or {}
    by_port = {
        f"{leaf}>{port}": total(n)
        for leaf, ports in drops.items()
        for port, n in ports.items()
        if total(n)
    }
    print(
        f"{Path(path).stem:16} {d['median_ms_per_iter']:7.1f} ms  lost "
        f"{100 * d['lost_fraction']:.3f} %  resent {d['retransmissions']:6d}  "
        f"leaf1 uplinks {100 * s1 / (s1 + s2):.0f}/{100 * s2 / (s1 + s2):.0f}  drops {by_port}"
    )
