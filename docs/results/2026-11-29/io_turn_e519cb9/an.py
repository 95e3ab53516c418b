"""Calls per ring call and per turn in one rank's I/O-thread profile.

python an.py PROFILE [RING_CALLS [ROWS]]
"""

import pstats
import sys

n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
st = pstats.Stats(sys.argv[1])
tot = sum(v[1] for v in st.stats.values())
# turns = calls of _take_input
turns = [v[1] for k, v in st.stats.items() if k[2] == "_take_input"]
per_turn = tot / max(turns[0], 1) if turns else 0
print(
    f"total {tot / n:.0f}/ring call, "
    f"turns {turns[0] / n if turns else 0:.1f}/ring call, {per_turn:.1f}/turn"
)
rows = sorted(st.stats.items(), key=lambda kv: -kv[1][1])
for k, v in rows[: int(sys.argv[3]) if len(sys.argv) > 3 else 80]:
    print(f"{v[1] / n:8.1f} {k[0].split('/')[-1]}:{k[1]}({k[2]})")
