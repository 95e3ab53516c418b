"""Rank 0's futex calls by thread and by the first two frames of their call chain
that say why (the GIL, a Python lock, the native engine's mutex or condition):
``perf script -i KIND.futex.data -F comm,ip,sym | python futex_callers.py``."""

import collections
import re
import sys

WHY = ("take_gil", "drop_gil", "PyEval_RestoreThread", "rlock_acquire",
       "lock_PyThread_acquire_lock", "send_thread", "send_batch_of", "Engine_post",
       "pthread_cond_signal", "pthread_cond_broadcast", "sem_post")  # fmt: skip
stacks: list[list[str]] = []
for line in sys.stdin:
    if not line.strip():
        continue
    if not line[0].isspace():
        stacks.append([re.sub(r"-\d+$", "", line.split()[0])])
    elif stacks and len(parts := line.split()) >= 2:
        stacks[-1].append(parts[1])
counts = collections.Counter(
    (s[0], " < ".join([f for f in s[1:] if any(w in f for w in WHY)][:2]) or "(other)")
    for s in stacks
)
for (thread, why), n in counts.most_common(25):
    print(f"{n:6d}  {thread:12s} {why}")
print(f"{len(stacks):6d}  total")
