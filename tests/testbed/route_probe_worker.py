"""One rank of tests/testbed/test_route_probe.py, run inside a testbed host.

    python route_probe_worker.py sender|receiver RANK0_ADDR RANK1_ADDR

Rank 0 (the sender) sends a 1 MB message to rank 1, waits until its endpoint
has probed the routes to rank 1 (its ``stats()["path_routes"]``), prints them as
one JSON line, waits for a line on stdin, sends an 8 MB message and prints
"sent". Rank 1 says "ready" once its endpoint listens, receives both, checks
their bytes, and prints its counters of rejected datagrams as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from dlcp.io import Endpoint, EndpointConfig
from dlcp.proto.config import ProtocolConfig

DATA_PORT, CONTROL_PORT = 47100, 47101
N_PATHS = 16
SMALL, LARGE = 1 << 18, 1 << 21  # float32 values: 1 MB, 8 MB


def main() -> None:
    role, addr0, addr1 = sys.argv[1:4]
    rank = 0 if role == "sender" else 1
    peers = {0: (addr0, DATA_PORT, CONTROL_PORT), 1: (addr1, DATA_PORT, CONTROL_PORT)}
    config = EndpointConfig(
        host=peers[rank][0],
        data_port=DATA_PORT,
        control_port=CONTROL_PORT,
        timeout=120.0,
        protocol=ProtocolConfig(n_paths=N_PATHS),
    )
    values = [np.arange(n, dtype=np.float32) for n in (SMALL, LARGE)]
    with Endpoint(rank, peers, config=config) as ep:
        if rank == 1:
            print("ready", flush=True)
            for msg, want in enumerate(values):
                got = ep.recv(src=0, msg=msg).result(timeout=120)
                assert np.array_equal(got.data, want), f"message {msg} arrived altered"
            stats = ep.stats()
            print(json.dumps({"rejected": stats["rejected"]}), flush=True)
            return
        ep.send(values[0], to=1, msg=0).result(timeout=120)
        deadline = time.monotonic() + 120
        while 1 not in (routes := ep.stats()["path_routes"]):
            assert time.monotonic() < deadline, "no routes probed within 120 s"
            time.sleep(0.05)  # (polling the endpoint's own record of the probe)
        print(json.dumps(routes[1]), flush=True)
        sys.stdin.readline()
        ep.send(values[1], to=1, msg=1).result(timeout=120)
        print("sent", flush=True)


if __name__ == "__main__":
    main()
