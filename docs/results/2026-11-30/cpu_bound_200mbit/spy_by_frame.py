"""Sum py-spy raw stacks (``py-spy record --threads -f raw``) of the testbed's
ranks: samples per thread, and the share of the I/O threads' samples each frame
is on the stack of (inclusive).

    python spy_by_frame.py /tmp/spy.*.txt
"""

from __future__ import annotations

import collections
import sys


def main() -> None:
    threads: collections.Counter[str] = collections.Counter()
    frames: collections.Counter[str] = collections.Counter()
    io = 0
    for path in sys.argv[1:]:
        with open(path) as f:
            for line in f:
                stack, _, count = line.rstrip().rpartition(" ")
                if not stack:
                    continue
                n = int(count)
                parts = stack.split(";")
                name = parts[0].split(": ", 1)[-1]
                threads[name.rstrip("-0123456789")] += n
                if name.startswith("dlcp-io"):
                    io += n
                    for frame in set(parts[1:]):
                        frames[frame.split(" (")[0]] += n
    total = sum(threads.values())
    print(f"{total} samples")
    for name, n in threads.most_common():
        print(f"  {name:24s} {100 * n / total:5.1f} %")
    print(f"I/O threads: {io} samples; frames on their stack")
    for frame, n in frames.most_common(40):
        print(f"  {100 * n / io:5.1f} %  {frame}")


if __name__ == "__main__":
    main()
