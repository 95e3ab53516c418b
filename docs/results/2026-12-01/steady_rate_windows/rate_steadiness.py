"""How steady a rank's lone rate reports are: for each ``<prefix>.<pid>`` that
``sitecustomize.py`` wrote (RATEPROF), the reports, the shared ones, and of the
consecutive lone reports to one source the share that moved less than 10 % and
25 %, and that came less than 10 ms apart.

    python3 rate_steadiness.py /tmp/rp
"""

from __future__ import annotations

import glob
import json
import math
import sys


def steadiness(log: list[list]) -> str:
    last: dict[str, tuple[float, float]] = {}
    moves: list[float] = []
    gaps: list[float] = []
    for now, shared, rates in log:
        if shared:
            last.clear()
            continue
        for src, rate in rates.items():
            if src in last and last[src][1] > 0 and rate > 0:
                moves.append(abs(math.log(rate / last[src][1])))
                gaps.append(now - last[src][0])
            last[src] = (now, rate)
    n = max(len(moves), 1)
    within = [sum(m < math.log(1 + band) for m in moves) / n for band in (0.1, 0.25)]
    close = sum(g < 0.01 for g in gaps) / n
    shared_n = sum(1 for entry in log if entry[1])
    return (
        f"reports {len(log)}, shared {shared_n}, lone pairs {len(moves)}: within 10 % "
        f"{within[0]:.3f}, within 25 % {within[1]:.3f}, under 10 ms apart {close:.3f}"
    )


for path in sorted(glob.glob(sys.argv[1] + ".*")):
    with open(path) as f:
        entries = json.load(f)
    if entries:
        print(path.rsplit(".", 1)[-1], steadiness(entries))
