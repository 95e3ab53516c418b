"""What a bytecode costs a warm interpreter: a loop of small method calls, its
bytecodes counted once with the opcode trace hook, then timed untraced.

    python hot_bytecodes.py
"""

import sys
import time


class State:
    __slots__ = ("a", "b", "c")

    def __init__(self) -> None:
        self.a, self.b, self.c = 1, 2.0, {}

    def step(self, now: float) -> float:
        if self.a > 0 and now > self.b:
            self.c[self.a] = now
        return self.b if self.a else now


STATE = State()
counted = [0]


def turn(now: float) -> float:
    t = 0.0
    for i in range(20):
        t += STATE.step(now + i)
    return t


def trace(frame, event, arg):
    frame.f_trace_opcodes = True

    def opcode(frame, event, arg):
        if event == "opcode":
            counted[0] += 1
        return opcode

    return opcode


sys.settrace(trace)
turn(5.0)
sys.settrace(None)
turns = 20000
t0 = time.perf_counter()
for _ in range(turns):
    turn(5.0)
seconds = time.perf_counter() - t0
print(f"hot: {counted[0]} bytecodes a turn, {1e9 * seconds / turns / counted[0]:.1f} ns a bytecode")
