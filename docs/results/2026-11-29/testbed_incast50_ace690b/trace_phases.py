"""Per iteration of a round trace (see summarise_trace.py): how long from the end of one
pull (the last first-round report of rank 0 to a worker) to the end of the next, how far
apart the pull's three reports are, and when each worker's last push round was reported,
counted from the end of the previous pull. Medians over the last two thirds.

    python trace_phases.py ROUNDS.txt ...
"""

import itertools
import statistics as st
import sys

for path in sys.argv[1:]:
    events = []
    with open(path) as f:
        for line in f:
            w = line.split()
            if w[1] != "FB":
                src, dst = map(int, w[1].split("->"))
                events.append((float(w[0]), src, dst, int(w[2].split("=")[1])))
    events.sort()
    groups: list[list[tuple[float, int, int, int]]] = [[]]
    for e in (e for e in events if e[1] == 0 and e[3] >= 1400):
        if groups[-1] and e[0] - groups[-1][-1][0] > 1.2:
            groups.append([])
        groups[-1].append(e)
    iteration, spread, push_end = [], [], {1: [], 2: [], 3: []}
    for prev, pull in itertools.pairwise(groups):
        start = prev[-1][0]
        iteration.append(pull[-1][0] - start)
        spread.append(pull[-1][0] - pull[0][0])
        for rank, ends in push_end.items():
            mine = [
                e[0] for e in events if e[1] == rank and e[2] == 0 and start < e[0] < pull[0][0]
            ]
            if mine:
                ends.append(max(mine) - start)
    k = len(iteration) // 3
    print(f"{path}: {len(iteration)} iterations, medians over the last {len(iteration) - k}")
    print(f"  pull end to pull end {st.median(iteration[k:]):.3f} s")
    print(f"  a pull's first to last report {st.median(spread[k:]):.3f} s")
    for rank, ends in push_end.items():
        print(f"  rank {rank}'s last push round {st.median(ends[k:]):.3f} s after the pull")
