"""Process CPU per message between two endpoints of one process on loopback, with
``preopen_trial.diff`` applied: the trial switched on and off in alternate messages
(20 warm-up messages first). Prints the mean CPU and wall time per message each way.

    python message_cpu_ab.py ELEMENTS MESSAGES_EACH_WAY
"""

import sys
import time

import numpy as np

import dlcp.proto.inbox as inbox
from dlcp.bench import Addresses
from dlcp.io import Endpoint, EndpointConfig

n, messages = int(sys.argv[1]), int(sys.argv[2])
store = Addresses()
config = EndpointConfig.from_env(timeout=60.0)
eps = [Endpoint(r, store=store, world_size=2, job=0x7A3, config=config) for r in range(2)]
tx, rx = eps
data = np.random.default_rng(1).standard_normal(n).astype(np.float32)
out = np.empty_like(data)
cpu = {False: 0.0, True: 0.0}
wall = {False: 0.0, True: 0.0}
for msg in range(2 * messages + 20):
    trial = bool(msg % 2)
    inbox._TRIAL[0] = trial
    c0, w0 = time.process_time(), time.perf_counter()
    incoming = rx.recv(src=0, msg=msg, out=out)
    sent = tx.send(data, to=1, msg=msg, p=0.0)
    incoming.result(60)
    sent.result(60)
    if msg >= 20:
        cpu[trial] += time.process_time() - c0
        wall[trial] += time.perf_counter() - w0
for ep in eps:
    ep.close()
base, with_trial = cpu[False] / messages * 1e6, cpu[True] / messages * 1e6
print(
    f"{n} elements: CPU us a message, base {base:.1f}, trial {with_trial:.1f} "
    f"({with_trial / base:.3f}); wall us, base {wall[False] / messages * 1e6:.1f}, "
    f"trial {wall[True] / messages * 1e6:.1f}"
)
