"""One row per run of run.sh: lossless plain and authenticated throughput."""

import glob
import json
from pathlib import Path

here = Path(__file__).parent
print("run | threads | DLCP GB/s | authenticated GB/s | auth / plain | DLCP / TCP | gmac")
for f in sorted(glob.glob(str(here / "*.out")), key=lambda p: (p.split("_")[-1], p)):
    d = json.loads(Path(f).read_text().splitlines()[-1])
    plain, auth = d["dlcp_lossless_gbps"], d["dlcp_auth_lossless_gbps"]
    print(
        f"{Path(f).stem} | {d['engine_threads']} | {plain} | {auth} | "
        f"{auth / plain:.3f} | {d['ratio_lossless']} | {d['machine']['gmac_backend']}"
    )
