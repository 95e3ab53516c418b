"""The 25 MB ring all-reduce (p = 0.05, the all-gather exact) with and without the
endpoint's in-process loss emulator: wall time per call, NACK rounds and
retransmitted packets per call, values lost. Run under dlcp.launch, once per loss:

    DLCP_EMULATED_LOSS=0.01 DLCP_NATIVE_RECEIVE=0 python -c "import sys;
        from dlcp.launch import launch; launch([sys.executable, 'loss_ring.py', '15',
        '6250000', '0.05'], 4, timeout=600)"

The emulator drops received data datagrams only (control messages travel intact)
and needs the Python run path, so both runs turn the native receive path off."""

import sys
import time

import numpy as np
import torch.distributed as dist

from dlcp.collectives import Communicator
from dlcp.collectives.ring import ring_allreduce
from dlcp.rendezvous import connect

iters, n, p = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
endpoint, job = connect(group="loss-ring")
comm = Communicator(endpoint, job.world_size, channel=1)
segments = [(0, n // 2, 0), (n // 2, n - n // 2, 1)]
for _ in range(3):
    ring_allreduce(comm, data, segments=segments, p=p, average=True)
walls: list[float] = []
nack_rounds = retransmitted = 0
lost = 0.0
for _ in range(iters):
    dist.barrier()
    start = time.perf_counter()
    report = ring_allreduce(comm, data, segments=segments, p=p, average=True)
    walls.append(time.perf_counter() - start)
    nack_rounds += report.nack_rounds
    retransmitted += report.retransmitted_packets
    lost += report.lost_fraction
print(
    f"rank {rank}: median {np.median(walls) * 1e3:.1f} ms, NACK rounds/call "
    f"{nack_rounds / iters:.2f}, retransmitted/call {retransmitted / iters:.1f}, "
    f"lost {lost / iters * 100:.3f} %"
)
endpoint.close()
