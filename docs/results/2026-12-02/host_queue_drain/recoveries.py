"""The times of each recovery in a testbed run made with recovery_timeline.diff applied
(TRIAL_LOG=/tmp/tlog in the environment of `dlcp testbed run`: each rank appends to
/tmp/tlog.<pid>). Usage: python recoveries.py /tmp/tlog.*

Lines: the receiver's NACK (key = its own rank, step, msg) and its completion, the
sender's NACK arrival and the report that the retransmission round went; one
recovery is keyed by (receiver, step, msg). Prints the quantiles of each leg."""

import re
import sys

nack: dict[tuple[int, int, int], float] = {}
got: dict[tuple[int, int, int], float] = {}
resent: dict[tuple[int, int, int], float] = {}
done: dict[tuple[int, int, int], float] = {}
for path in sys.argv[1:]:
    with open(path) as lines:
        text = lines.read().splitlines()
    for line in text:
        f = line.split()
        if f[0] == "nack":
            r, step, msg = f[3].split("/")
            nack.setdefault((int(r), int(step), int(msg)), float(f[1]))
        elif f[0] in ("gotnack", "resent"):
            _, step, msg = f[3].split("/")
            key = (int(f[5]), int(step), int(msg))
            (got if f[0] == "gotnack" else resent).setdefault(key, float(f[1]))
        elif f[0] == "done":
            m = re.match(r"done (\S+) key \((\d+), (\d+), (\d+)\)", line)
            if m:
                done[(int(m[2]), int(m[3]), int(m[4]))] = float(m[1])


def legs(a: dict, b: dict) -> list[float]:
    return sorted(b[k] - a[k] for k in a if k in b)


def quantiles(x: list[float]) -> str:
    if not x:
        return "none"

    def q(p: float) -> float:
        return x[min(int(len(x) * p), len(x) - 1)] * 1e3

    top = x[-1] * 1e3
    return f"n={len(x)}: p10 {q(0.1):.1f}, p50 {q(0.5):.1f}, p90 {q(0.9):.1f}, max {top:.1f} ms"


print("NACK sent -> at the sender:          ", quantiles(legs(nack, got)))
print("at the sender -> resend reported sent:", quantiles(legs(got, resent)))
print("resend reported sent -> completed:    ", quantiles(legs(resent, done)))
print("NACK sent -> completed:               ", quantiles(legs(nack, done)))
