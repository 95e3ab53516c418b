"""Medians over the short transport runs of each variant (``short_runs/``: the last
stdout line of each ``dlcp.bench.transport`` run is its JSON):

    python summarize.py short_runs
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

rows = defaultdict(list)
for path in sorted(Path(sys.argv[1]).glob("*.json")):
    variant = path.stem.rsplit("_", 1)[0]
    d = json.loads(path.read_text().splitlines()[-1])
    off = d["offloads_off_lossless"]
    rows[variant].append({
        "lossless DLCP / TCP": d["dlcp_lossless_gbps"] / d["tcp_lossless_gbps"],
        "offloads off: DLCP GB/s": off["dlcp_gbps"],
        "offloads off: DLCP / TCP": off["dlcp_gbps"] / off["tcp_gbps"],
        "offloads off: DLCP / UDP floor": off["dlcp_gbps"] / d["udp_floor_offloads_off_gbps"],
        "1 % loss median, DLCP / TCP": d["ratio_loss_median"],
        "1 % loss p99, DLCP / TCP": d["ratio_loss_p99"],
        "resent a lossy transfer": d["dlcp_loss_retransmitted_packets_mean"],
        "values lost under loss": d["dlcp_loss_lost_fraction_mean"],
    })
for variant, runs in rows.items():
    print(f"{variant} ({len(runs)} runs): medians (ranges)")
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(f"  {key}: {statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})")
