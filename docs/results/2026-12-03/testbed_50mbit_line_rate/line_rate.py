"""How much of a testbed run's iteration the busiest host's link was busy sending,
from the result JSONs of ``dlcp testbed run`` (their ``host_queues``: the bytes each
host's shaped egress sent over the run), and the time a DLCP iteration would need to
meet a target ratio over Gloo's iteration of the same scenario:

    python line_rate.py RESULTS_DIR [RESULTS_DIR ...]

The host queues count every byte of the run (its data, headers, acknowledgements and
control traffic, and the test pass after each epoch), so "link ms" over-counts the
training iterations' own traffic a little: it is an upper bound of the link time
an iteration needs, and the median iteration a lower one of what it took.
"""

import json
import sys
from pathlib import Path

TARGETS = {"clean": 1.05, "loss": 0.9, "background": 0.67, "incast": 0.8}

runs = {}
for folder in sys.argv[1:]:
    for path in sorted(Path(folder).glob("*.json")):
        d = json.loads(path.read_text())
        if "host_queues" not in d or "train" not in d:
            continue
        iters = sum(e["iterations"] for e in d["train"]["epochs"])
        per_host = max(q["bytes"] for q in d["host_queues"].values())
        rate = d["link_rate_mbit"] * 1e6 / 8  # bytes a second
        link_ms = per_host / iters / rate * 1e3
        med = d["median_ms_per_iter"]
        key = (path.parent.name, d["scenario"], d["link_rate_mbit"])
        runs.setdefault(key, {})[d["transport"]] = (med, link_ms, per_host / iters / 1e6)
        print(f"{path.parent.name}/{path.name}: {iters} iterations, the busiest host sent "
              f"{per_host / iters / 1e6:.3f} MB an iteration, link {link_ms:.0f} ms "
              f"of the median {med:.1f} ms ({100 * link_ms / med:.0f} %)")
print()
for (folder, scenario, mbit), t in sorted(runs.items()):
    if "dlcp" not in t or "gloo" not in t or scenario not in TARGETS:
        continue
    (dm, dl, _), (gm, gl, _) = t["dlcp"], t["gloo"]
    want = TARGETS[scenario] * gm
    print(f"{folder} {scenario} {mbit:g} Mbit/s: DLCP / Gloo {dm / gm:.3f}; the target "
          f"{TARGETS[scenario]} asks DLCP for {want:.0f} ms, its link time is {dl:.0f} ms "
          f"({want - dl:+.0f} ms left for all else; Gloo's iteration has {gm - gl:.0f} ms "
          "beside its link time)")
