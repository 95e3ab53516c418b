"""One line per testbed run of run.sh (its JSON), then the medians per kind.

python docs/results/2026-12-04/ps_pieces/summary.py FOLDER
"""

import glob
import json
import statistics
import sys
from collections import defaultdict

rows = defaultdict(list)
print(f"{'run':22} {'ms/iter':>8} {'lost %':>7} {'resent':>7} {'idle %':>7} {'steal %':>8}  code")
for path in sorted(glob.glob(f"{sys.argv[1]}/*/*.json")):
    with open(path) as f:
        d = json.load(f)
    name = path.split("/")[-2]
    ms = d["median_ms_per_iter"]
    rows[name.rsplit("-", 1)[0]].append(ms)
    lost = "-" if d["lost_fraction"] is None else f"{100 * d['lost_fraction']:.2f}"
    resent = "-" if d["retransmissions"] is None else str(d["retransmissions"])
    cpu = d["cpu"]
    print(
        f"{name:22} {ms:8.1f} {lost:>7} {resent:>7} {cpu['idle_pct']:7.1f} "
        f"{cpu['steal_pct']:8.1f}  {d['code_rev']}"
    )
print()
for kind, ms in sorted(rows.items()):
    print(f"{kind:22} median {statistics.median(ms):8.1f} ms/iter over {len(ms)} run(s)")
for arm in ("pieces", "whole"):
    if rows.get(f"{arm}-dlcp") and rows.get(f"{arm}-gloo"):
        r = statistics.median(rows[f"{arm}-dlcp"]) / statistics.median(rows[f"{arm}-gloo"])
        print(f"{arm}: DLCP / Gloo (medians) {r:.3f}")
