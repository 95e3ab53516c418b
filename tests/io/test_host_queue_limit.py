"""The native engine keeps the host's queue of its datagrams short (root: a namespace
whose loopback drains a deep queue at 50 Mbit/s, as a shaped host's NIC does).

A pacer whose rate is above the host link's (the receiver claimed more, or a new
message starts at ``initial_rate``) would otherwise put a whole message into the
host's qdisc at once, and that queue reaches the switch at the link's rate whatever
the pacer learns later. With ``queue_limit`` the engine reads what its sockets still
hold (SIOCOUTQ) and holds its next batch while that is more than a few bursts."""

from __future__ import annotations

import json
import sys

import pytest

from dlcp.io.engine import native_available
from testbed.netns import missing_tools, netns_loopback

MISSING = missing_tools()

#: run inside the namespace: one engine sends a round of 2,000 datagrams of 1,400
#: bytes, paced at 1 GB/s, through a queue that drains at 50 Mbit/s and holds them
#: all; the most its socket held (SIOCOUTQ, sampled every millisecond) and what left
_SENDER = r"""
import fcntl, json, select, socket, struct, sys, termios
import numpy as np
from dlcp.io import _engine

N, SIZE, SO_SNDBUFFORCE = 2000, 1400, 32
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE: nothing dropped there
rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 16 << 20)  # (the round fits whole)
tx.bind(("127.0.0.1", 0))
engine = _engine.Engine([tx.fileno()], 44, "dlcp-queue", threads=1,
                        queue_limit=sys.argv[1] == "on")
queued = lambda: struct.unpack("i", fcntl.ioctl(tx.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
most = 0
try:
    engine.add_peer(1, "127.0.0.1", rx.getsockname()[1],
                    _engine.Pacer(initial_rate=1e9, min_rate=1e6, burst_bytes=65536))
    z = np.zeros(N, np.uint8)
    ended = engine.post(dst=1, step=0, msg=0, order=1,
                        records=np.zeros((N, SIZE), np.uint8), stride=SIZE,
                        per_message=1, count=N, short=-1, short_len=SIZE, tos=z,
                        path=z, prio=z, breaks=np.array([N], np.int64))
    assert ended is None, "a round of 2,000 datagrams went from post()"
    while True:
        most = max(most, queued())
        ready, _, _ = select.select([engine.fileno()], [], [], 0.001)
        if ready:
            (ended,) = engine.reap()
            break
    sent = engine.stats()["engine_datagrams"]
finally:
    engine.close()
print(json.dumps({"most": most, "sent": sent, "failed": ended[3]}))
"""


@pytest.mark.root
@pytest.mark.skipif(not native_available(), reason="native engine not built")
@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (a network namespace)")
def test_the_engine_holds_its_batches_while_the_host_s_queue_is_full() -> None:
    out = {}
    with netns_loopback() as box:
        # a NIC's pace with a queue deep enough for the whole round (nothing dropped)
        box.run(["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "50mbit",
                 "burst", "3000", "limit", str(16 << 20)])  # fmt: skip
        for setting in ("off", "on"):
            proc = box.run([sys.executable, "-c", _SENDER, setting], check=False)
            assert proc.returncode == 0, proc.stderr
            out[setting] = json.loads(proc.stdout)
    for setting in ("off", "on"):
        assert out[setting]["failed"] == 0 and out[setting]["sent"] == 2000, out
    # (bytes as the kernel charges them, about 2.3 KB a 1,400-byte datagram here)
    # unlimited, the paced 1 GB/s put most of the round's 2.8 MB in the queue at once
    assert out["off"]["most"] > 2 << 20, out
    # limited: four bursts of 64 KB, and the batch that went as the queue filled
    assert out["on"]["most"] < 600 << 10, out
