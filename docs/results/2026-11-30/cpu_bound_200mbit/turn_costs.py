"""Sum the I/O threads' turns by kind (``trial_turns.diff``: each turn's thread CPU,
split into the input's Python, the sending and settling after it, and the data
socket's receive call, which holds the C receive loop, its syscalls and the
hand-over of what it took to the session).

    python turn_costs.py turns/*.json

A kind names the ready files other than the data socket (``control``, ``engine``:
the send threads' reports, ``wake``: a caller, ``accept``), then ``+timer`` if the
session's timer fired and ``+data`` if the receive call read anything.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main() -> None:
    total: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for path in sys.argv[1:]:
        with open(path) as f:
            for kind, values in json.load(f).items():
                for i, v in enumerate(values):
                    total[kind][i] += v
    print("| kind | turns | input Python ms | settling ms | receive call ms | us a turn |")
    print("|---|---|---|---|---|---|")
    rows = sorted(total.items(), key=lambda kv: -sum(kv[1][1:]))
    for kind, (n, inp, settle, recv) in rows[:12]:
        per = f"{inp / n / 1e3:.0f} / {settle / n / 1e3:.0f} / {recv / n / 1e3:.0f}"
        print(f"| {kind} | {n} | {inp / 1e6:.1f} | {settle / 1e6:.1f} | {recv / 1e6:.1f} | {per} |")
    sums = [sum(v[i] for v in total.values()) for i in range(4)]
    ms = " | ".join(f"{s / 1e6:.1f}" for s in sums[1:])
    print(f"| all | {sums[0]} | {ms} | |")


if __name__ == "__main__":
    main()
