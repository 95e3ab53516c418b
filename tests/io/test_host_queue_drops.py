"""A datagram the host's own egress queue drops is a lost packet, not a refused
send (root: a namespace whose loopback has a tiny shaped queue).

A qdisc that is full drops the packet and tells the sender ENOBUFS, which the
kernel passes on to a UDP socket only when it has ``IP_RECVERR`` set (without it
the drop is silent). The senders here set it, so the condition is real: a plain
``sendto`` loop sees ENOBUFS. The C senders (``send_batch``, ``send_gathered``,
the native engine's rounds: ``_sendmmsg.h``) and the Python fallback
(``DataSockets``' ``sendmsg`` loop) go on past such a drop and count what left;
an engine round is reported sent, not failed, so the endpoint does not fail its
peer (the receiver asks for what is missing, as for any loss)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlcp.io.engine import native_available
from testbed.netns import missing_tools, netns_loopback

MISSING = missing_tools()

#: run inside the namespace: every sender against a queue of about two datagrams
#: that drains at 50 Mbit/s (a datagram in 0.22 ms: senders that write at memory
#: speed overflow it), through sockets with IP_RECVERR. Each sender starts once the
#: queue is empty (its backlog, as tc reports it, is 0): its first datagram then
#: fits, however long a busy machine takes to drain what the one before left
_SENDERS = r"""
import errno, json, select, socket, subprocess, sys, time
import numpy as np
from dlcp.io import udp


def drained():
    deadline = time.monotonic() + 30
    while True:
        shown = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", "lo"],
                               capture_output=True, text=True, check=True).stdout
        if all(q.get("qlen", 0) == 0 for q in json.loads(shown)):
            return
        assert time.monotonic() < deadline, "the loopback's queue did not drain: " + shown
        select.select([], [], [], 0.001)

IP_RECVERR = 11
N, SIZE = 200, 1400
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", 0))
port = rx.getsockname()[1]


def sender():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    s.bind(("127.0.0.1", 0))
    return s


out = {}
plain, refused = sender(), 0
for _ in range(N):
    try:
        plain.sendto(b"x" * SIZE, ("127.0.0.1", port))
    except OSError as exc:
        if exc.errno != errno.ENOBUFS:
            raise
        refused += 1
out["plain_enobufs"] = refused
data = np.zeros(N * SIZE, np.uint8)
heads = np.zeros((N, 32), np.uint8)
payload = np.zeros(N * (SIZE - 32), np.uint8)  # (a 32-byte header and a chunk a datagram)
if udp._udpio is not None:
    batch_sock, gather_sock = sender(), sender()
    drained()
    out["send_batch"] = udp._udpio.send_batch(
        batch_sock.fileno(), data, SIZE, 1, "127.0.0.1", port, 0)
    drained()
    out["send_gathered"] = udp._udpio.send_gathered(
        gather_sock.fileno(), heads, 32, payload, SIZE - 32, 1, "127.0.0.1", port, 0)
udp._udpio = None  # the Python fallback: a sendmsg a message
socks = udp.DataSockets("127.0.0.1", 0, 1, gso="off", gro="off", rcvbuf=1 << 20,
                        sndbuf=1 << 20)
socks.send_socks[0].setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
drained()
out["python_send"] = socks.send(memoryview(data), SIZE, N, path=0, tos=0,
                                addr=("127.0.0.1", port))
drained()
out["python_send_gathered"] = socks.send_gathered(
    heads, payload, SIZE - 32, path=0, tos=0, addr=("127.0.0.1", port))
if sys.argv[1] == "native":
    from dlcp.io import _engine
    tx = sender()
    drained()
    engine = _engine.Engine([tx.fileno()], 352, "dlcp-enobufs", threads=1)
    try:
        engine.add_peer(1, "127.0.0.1", port, _engine.Pacer(unpaced=True))
        z = np.zeros(N, np.uint8)
        ended = engine.post(dst=1, step=0, msg=0, order=1,
                            records=np.zeros((N, SIZE), np.uint8), stride=SIZE,
                            per_message=1, count=N, short=-1, short_len=SIZE, tos=z,
                            path=z, prio=z, breaks=np.array([N], np.int64))
        if ended is None:
            ready, _, _ = select.select([engine.fileno()], [], [], 30)
            assert ready, "the engine reported nothing"
            (ended,) = engine.reap()
        out["engine_failed"], out["engine_errno"] = ended[3], ended[4]
        out["engine_datagrams"] = engine.stats()["engine_datagrams"]
    finally:
        engine.close()
print(json.dumps(out))
"""


@pytest.mark.root
@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (a network namespace)")
def test_a_datagram_the_host_queue_drops_is_lost_not_a_failed_send() -> None:
    with netns_loopback() as box:
        # about two datagrams of queue, drained at 50 Mbit/s
        box.run(["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "50mbit",
                 "burst", "3000", "limit", "3000"])  # fmt: skip
        engine = "native" if native_available() else "python"
        proc = box.run([sys.executable, "-c", _SENDERS, engine], check=False)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
    n = 200
    # the condition is real: a plain send loop is told ENOBUFS
    assert out["plain_enobufs"] > 0, out
    # every sender goes on past the drops, and counts only what left
    for key in ("send_batch", "send_gathered", "python_send", "python_send_gathered"):
        if key in out:
            assert 0 < out[key] < n, (key, out)
    if engine == "native":
        assert (out["engine_failed"], out["engine_errno"]) == (0, 0), out
        assert 0 < out["engine_datagrams"] < n, out
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert box.ns not in listed.stdout.split()
