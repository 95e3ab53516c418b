"""The bytecodes per message and plan_message times of this folder's runs, per commit.

python summarize.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
COMMITS = ("87a6edc", "c6e062b")


def main() -> None:
    print("bytecodes per message, caller / sender's I/O thread / receiver's I/O thread:")
    for rev in COMMITS:
        for path in sorted(HERE.glob(f"turns_{rev}_*.json")):
            sizes = json.loads(path.read_text())["sizes"]
            cells = [
                f"{n}: {s['bytecodes_caller']} / {s['bytecodes_sender_io']} / "
                f"{s['bytecodes_receiver_io']}"
                for n, s in sizes.items()
            ]
            print(f"  {path.stem}: " + ", ".join(cells))
    print("plan_message, us a call (median and range of the runs):")
    for rev in COMMITS:
        runs = [
            json.loads(p.read_text())["plan_message_us"]
            for p in sorted(HERE.glob(f"plan_timing_{rev}_*.json"))
        ]
        cells = [
            f"{n}: {statistics.median(r[n] for r in runs):.2f} "
            f"({min(r[n] for r in runs):.2f}-{max(r[n] for r in runs):.2f})"
            for n in runs[0]
        ]
        print(f"  {rev} ({len(runs)} runs): " + ", ".join(cells))


if __name__ == "__main__":
    main()
