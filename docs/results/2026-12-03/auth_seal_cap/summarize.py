"""One line per transport run of a folder, then the medians (ranges) per condition.

    python summarize.py where_the_time_goes

A run is a ``*.out`` file whose last line is ``dlcp.bench.transport``'s JSON; its
condition is the file name without the trailing ``_<round>``."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main(folder: Path) -> None:
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    for path in sorted(folder.glob("*.out")):
        lines = path.read_text().strip().splitlines()
        try:
            result = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            continue
        if result.get("bench") == "auth" or "dlcp_auth_lossless_gbps" not in result:
            continue
        condition = path.stem.rsplit("_", 1)[0]
        auth, plain = result["dlcp_auth_lossless_gbps"], result["dlcp_lossless_gbps"]
        machine = result["machine"]
        steal = machine["cpu_steal_fraction"]
        rows.setdefault(condition, []).append((auth, plain, auth / plain, steal))
        print(
            f"{path.name:26} auth {auth:.3f} GB/s  plain {plain:.3f} GB/s  "
            f"auth/plain {auth / plain:.3f}  steal {steal:.3f}  "
            f"{machine['openssl']}  {machine.get('gmac_backend', '-')}"
        )
    print()
    for condition, runs in rows.items():
        median = [statistics.median(r[i] for r in runs) for i in range(4)]
        low = [min(r[i] for r in runs) for i in range(3)]
        high = [max(r[i] for r in runs) for i in range(3)]
        print(
            f"{condition:20} n={len(runs)}  auth {median[0]:.3f} ({low[0]:.3f}-{high[0]:.3f})  "
            f"plain {median[1]:.3f} ({low[1]:.3f}-{high[1]:.3f})  "
            f"auth/plain {median[2]:.3f} ({low[2]:.3f}-{high[2]:.3f})  steal {median[3]:.3f}"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
