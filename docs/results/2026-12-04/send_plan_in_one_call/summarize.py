"""One line per A/B run of ``ab.sh`` and the medians: the 25 MB ring's CPU
(ms, four ranks, a call) and its ratio to the UDP floor's, before and after."""

import json
import pathlib
import statistics
import sys

folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent / "ab")
rows: dict[str, list[tuple[int, float, float, float]]] = {"old": [], "new": []}
for f in sorted(folder.glob("*.json")):
    kind, run = f.stem.split("_")
    d = json.loads(f.read_text())
    steal = d["machine"]["cpu_steal_fraction"]
    rows[kind].append((int(run), d["ring_cpu_ms"], d["ring_over_floor_cpu"], steal))
for kind, runs in rows.items():
    for run, cpu, ratio, steal in sorted(runs):
        print(f"{kind} {run:2d}  ring CPU {cpu:7.2f} ms  over floor {ratio:.3f}  steal {steal:.3f}")
for kind, runs in rows.items():
    cpus, ratios = [r[1] for r in runs], [r[2] for r in runs]
    print(
        f"{kind}: ring CPU median {statistics.median(cpus):.1f} ms ({min(cpus):.1f}-"
        f"{max(cpus):.1f}), over floor median {statistics.median(ratios):.3f} "
        f"({min(ratios):.3f}-{max(ratios):.3f}), {len(runs)} runs"
    )
