"""How steady a rank's lone rate reports are, and over what windows: for each
``<prefix>.<pid>`` that ``sitecustomize.py`` wrote (WINDOWPROF), the reports, the share
of consecutive lone reports to one source within 10 % and 25 % of the one before, the
windows' lengths (10th, 50th and 90th percentiles, ms) and the median share of a
window the receiver waited.

    python3 windows.py /tmp/wp
"""

from __future__ import annotations

import glob
import json
import math
import statistics
import sys


def summary(log: list[list]) -> str:
    last: dict[str, float] = {}
    moves: list[float] = []
    lengths: list[float] = []
    idle: list[float] = []
    for now, shared, start, waited, _bytes, rates in log:
        if shared:
            last.clear()
            continue
        lengths.append(now - start)
        idle.append(waited / (now - start))
        for src, rate in rates.items():
            if last.get(src, 0) > 0 and rate > 0:
                moves.append(abs(math.log(rate / last[src])))
            last[src] = rate
    n = max(len(moves), 1)
    within = [sum(m < math.log(1 + band) for m in moves) / n for band in (0.1, 0.25)]
    p10, p50, p90 = (1e3 * statistics.quantiles(lengths, n=10)[i] for i in (0, 4, 8))
    return (
        f"reports {len(log)}: within 10 % {within[0]:.3f}, within 25 % {within[1]:.3f}; "
        f"windows ms {p10:.1f} / {p50:.1f} / {p90:.1f}; waited {statistics.median(idle):.2f}"
    )


for path in sorted(glob.glob(sys.argv[1] + ".*")):
    with open(path) as f:
        entries = json.load(f)
    if len(entries) > 2:
        print(path.rsplit(".", 1)[-1], summary(entries))
