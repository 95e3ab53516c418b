"""One row per run of run.sh: DLCP's and the floor's loss-phase figures."""

import glob
import json
import statistics
from pathlib import Path

here = Path(__file__).parent
print(
    "run | threads | DLCP/TCP median, p99 | DLCP median s | under 0.11 s | TCP median s"
    " | floor median (min) s | lossless DLCP/TCP | offloads-off lossless DLCP, floor GB/s"
)
for f in sorted(glob.glob(str(here / "*.out")), key=lambda p: (p.split("_")[-1], p)):
    d = json.loads(Path(f).read_text().splitlines()[-1])
    s = d["dlcp_loss_seconds"]
    off = d["offloads_off_lossless"]
    print(
        f"{Path(f).stem} | {d['engine_threads']} | {d['ratio_loss_median']}, "
        f"{d['ratio_loss_p99']} | {statistics.median(s):.4f} | "
        f"{sum(x < 0.11 for x in s)} of {len(s)} | {d['tcp_loss_median_s']} | "
        f"{d['udp_floor_loss_median_s']} ({d['udp_floor_loss_min_s']}) | "
        f"{d['ratio_lossless']} | {off['dlcp_gbps']}, {d['udp_floor_offloads_off_gbps']}"
    )
