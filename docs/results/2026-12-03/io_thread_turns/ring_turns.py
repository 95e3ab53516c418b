"""The 25 MB ring all-reduce in a loop (4 ranks, ``p = 0.05``): what rank 0's I/O
thread's turns were for, counted by wrapping the endpoint's methods (its receive calls,
the files ``select`` found ready, the callers' commands, the control frames Python
applied and whether a wait had taken them), per call:

    python -c "import sys; from dlcp.launch import launch; launch([sys.executable,
        'ring_turns.py', '30', '6250000', '0.05'], 4, timeout=600)"
"""
import collections
import sys

import numpy as np
import torch.distributed as dist

import dlcp.collectives.ring as ring
from dlcp.collectives import Communicator
from dlcp.io import control_input, io_loop
from dlcp.io import endpoint as ep
from dlcp.proto.wire import PacketType
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
counts = collections.Counter()
on = [False]

orig_receive = io_loop.IOLoop._receive_data
def _receive_data(self, start, timer=None, *, may_linger=True):
    if on[0]:
        counts["receive calls"] += 1
        counts["receive calls that may linger"] += bool(may_linger and self._linger)
    return orig_receive(self, start, timer, may_linger=may_linger)
io_loop.IOLoop._receive_data = _receive_data

orig_ready = io_loop.IOLoop._on_ready
def _on_ready(self, sel, sock, what):
    if on[0]:
        counts[f"ready: {what}"] += 1
    return orig_ready(self, sel, sock, what)
io_loop.IOLoop._on_ready = _on_ready

orig_post = ep.Endpoint._post
def _post(self, command, fut):
    if on[0]:
        counts["caller commands"] += 1
        counts["caller commands that woke a lingering receive"] += bool(self._lingering)
    return orig_post(self, command, fut)
ep.Endpoint._post = _post

orig_select = io_loop.ReadSelector.select
def select(self, timeout=None):
    r = orig_select(self, timeout)
    if on[0]:
        counts["selects"] += 1
        counts["selects that returned nothing ready"] += not r
    return r
io_loop.ReadSelector.select = select


in_stash = [False]
orig_frame = control_input.ControlInput._control_frame
def _control_frame(self, peer, datagram, now):
    if on[0]:
        kind = PacketType(datagram[0] & 0x0F).name
        how = " (taken in a wait)" if in_stash[0] else " (read)"
        counts[f"control to Python: {kind}{how}"] += 1
    return orig_frame(self, peer, datagram, now)
control_input.ControlInput._control_frame = _control_frame
orig_stops = control_input.ControlInput._stops_taken
def _stops_taken(self):
    in_stash[0] = True
    try:
        return orig_stops(self)
    finally:
        in_stash[0] = False
control_input.ControlInput._stops_taken = _stops_taken

dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="turns")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
dist.barrier()
on[0] = rank == 0
for _ in range(iters):
    ring.ring_allreduce(comm, data, segments=segments, p=p, average=True)
on[0] = False
if rank == 0:
    for k, v in sorted(counts.items()):
        print(f"{v / iters:8.2f} a call  {k}")
dist.barrier()
endpoint.close()
