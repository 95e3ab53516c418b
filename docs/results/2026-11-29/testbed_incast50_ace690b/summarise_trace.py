"""Per-worker figures of the pushes (worker -> rank 0) in a round trace, over the last
two thirds of the run. A trace line is either a round's loss report,

    TIME SRC->DST chunks=N lost=F q=0|1 sent_at=MB/s rate BEFORE->AFTER

or a rate report (at most one per pair every 50 ms),

    TIME FB SRC->DST reported=MB/s rate BEFORE->AFTER

    python summarise_trace.py ROUNDS.txt ...
"""

import statistics as st
import sys

for path in sys.argv[1:]:
    rounds, reports = [], []
    with open(path) as f:
        for line in f:
            w = line.split()
            if w[1] == "FB":
                src, dst = map(int, w[2].split("->"))
                reported = float(w[3].split("=")[1])
                after = float(w[5].split("->")[1])
                reports.append((float(w[0]), src, dst, reported, after))
            else:
                src, dst = map(int, w[1].split("->"))
                kv = dict(x.split("=") for x in w[2:6])
                rounds.append(
                    (float(w[0]), src, dst, int(kv["chunks"]), float(kv["lost"]),
                     int(kv["q"]), float(kv["sent_at"]))
                )  # fmt: skip
    t0, t1 = rounds[0][0], rounds[-1][0]
    late = t0 + (t1 - t0) / 3
    print(path)
    for rank in (1, 2, 3):
        mine = [r for r in rounds if r[1] == rank and r[2] == 0 and r[0] > late]
        first = [r for r in mine if r[3] >= 1400]
        resends = len(mine) - len(first)
        fb = [x for x in reports if x[1] == rank and x[2] == 0 and x[0] > late]
        print(
            f"  rank {rank}: {len(first)} first rounds, lost (median) "
            f"{st.median(r[4] for r in first):.3f}, sent at {st.median(r[6] for r in first):.1f}"
            f" MB/s, {sum(r[5] for r in first)} queue-signalled; {resends} resend rounds"
        )
        print(
            f"          pacer {st.median(x[4] for x in fb):.1f} MB/s, "
            f"report {st.median(x[3] for x in fb):.1f} MB/s (medians)"
        )
