"""Python calls per turn of an idle I/O thread (select times out after its 1 s cap,
nothing due), counted as cProfile counts them: Python and C function calls."""

import sys
import time

import numpy as np

from dlcp.bench import Addresses
from dlcp.io import Endpoint, EndpointConfig, io_loop

calls = [0]


def counter(frame, event, arg):
    if event in ("call", "c_call"):
        calls[0] += 1


orig = io_loop.IOLoop._run


def run(self):
    if self.rank == 0:
        sys.setprofile(counter)
    return orig(self)


io_loop.IOLoop._run = run
store = Addresses()
cfg = EndpointConfig.from_env(timeout=30)
eps = [Endpoint(r, store=store, world_size=2, job=5, config=cfg) for r in range(2)]
d = np.ones(1000, np.float32)
out = np.empty_like(d)
f = eps[1].recv(src=0, msg=1, out=out)
s = eps[0].send(d, to=1, msg=1, p=0.0)
f.result(10)
s.result(10)
time.sleep(3.0)  # (timers of the exchange run out)
t0 = eps[0]._stats.receive_calls
c0 = calls[0]
time.sleep(6.0)
t1 = eps[0]._stats.receive_calls
c1 = calls[0]
print(f"idle: {t1 - t0} turns, {(c1 - c0) / max(t1 - t0, 1):.1f} calls a turn")
for e in eps:
    e.close()
