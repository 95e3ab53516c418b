"""The native engine keeps the host's queue of its datagrams short (root: a namespace
whose loopback drains a deep queue at 50 Mbit/s, as a shaped host's NIC does).

A pacer whose rate is above the host link's (the receiver claimed more, or a new
message starts at ``initial_rate``) would otherwise put a whole message into the
host's qdisc at once, and that queue reaches the switch at the link's rate whatever
the pacer learns later. With ``queue_limit`` the engine reads what its sockets still
hold (SIOCOUTQ) and holds its next batch while that is more than a few bursts, and,
once it has seen the queue drain, more than 2 ms of what it drains."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from dlcp.io.engine import NATIVE_BURST_TIME, native_available
from testbed.netns import missing_tools, netns_loopback

MISSING = missing_tools()

#: run inside the namespace: one engine sends rounds of 2,000 datagrams of 1,400 bytes
#: (argv[3] of them, one after the other, each posted once the last has been sent
#: and has left the host), paced with the pacer options of argv[2], through a queue
#: that drains at 50 Mbit/s and holds them all; per round, the most its socket held
#: (SIOCOUTQ, sampled every millisecond) and what left
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
rounds = []
try:
    engine.add_peer(1, "127.0.0.1", rx.getsockname()[1], _engine.Pacer(**json.loads(sys.argv[2])))
    z = np.zeros(N, np.uint8)
    for msg in range(int(sys.argv[3])):
        ended = engine.post(dst=1, step=0, msg=msg, order=msg + 1,
                            records=np.zeros((N, SIZE), np.uint8), stride=SIZE,
                            per_message=1, count=N, short=-1, short_len=SIZE, tos=z,
                            path=z, prio=z, breaks=np.array([N], np.int64))
        assert ended is None, "a round of 2,000 datagrams went from post()"
        most = 0
        while True:
            ready, _, _ = select.select([engine.fileno()], [], [], 0.001)
            most = max(most, queued())  # (after the wait: a round can end during it)
            if ready:
                (ended,) = engine.reap()
                break
        while queued():  # (the next round starts on an empty queue, as after an idle spell)
            select.select([], [], [], 0.001)
        rounds.append({"most": most, "failed": ended[3]})
    sent = engine.stats()["engine_datagrams"]
finally:
    engine.close()
print(json.dumps({"rounds": rounds, "sent": sent}))
"""

#: the pacer of the first test, and the endpoint's (dlcp.proto.config, the native
#: engine's burst time): bursts of 250 KB at its initial 1.25 GB/s
_PACER = {"initial_rate": 1e9, "min_rate": 1e6, "burst_bytes": 65536}
_ENDPOINT_PACER = {"initial_rate": 1.25e9, "min_rate": 1e6, "burst_bytes": 1 << 19,
                   "burst_time": NATIVE_BURST_TIME}  # fmt: skip


def _send(box: Any, setting: str, pacer: dict[str, float], rounds: int) -> dict[str, Any]:
    proc = box.run([sys.executable, "-c", _SENDER, setting, json.dumps(pacer), str(rounds)],
                   check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    assert out["sent"] == 2000 * rounds, out
    assert all(r["failed"] == 0 for r in out["rounds"]), out
    return out


@pytest.mark.root
@pytest.mark.skipif(not native_available(), reason="native engine not built")
@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (a network namespace)")
def test_the_engine_holds_its_batches_while_the_host_s_queue_is_full() -> None:
    out = {}
    with netns_loopback() as box:
        _shape(box)
        for setting in ("off", "on"):
            out[setting] = _send(box, setting, _PACER, 1)["rounds"][0]["most"]
    # (bytes as the kernel charges them, about 2.3 KB a 1,400-byte datagram here)
    # unlimited, the paced 1 GB/s put most of the round's 2.8 MB in the queue at once
    assert out["off"] > 2 << 20, out
    # limited: four bursts of 64 KB, and the batch that went as the queue filled
    assert out["on"] < 600 << 10, out


@pytest.mark.root
@pytest.mark.skipif(not native_available(), reason="native engine not built")
@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (a network namespace)")
def test_once_the_engine_has_seen_the_queue_drain_a_new_round_adds_2_ms_of_it() -> None:
    """A message after an idle spell starts at the pacer's initial rate, in bursts of
    250 KB: four of them filled the host's queue with ~1 MB (as charged), 160 ms of a
    50 Mbit/s link that the rank's retransmissions and control messages then waited
    behind, at the start of every message. Once the engine has seen the queue drain
    (the first round), later rounds keep it to 2 ms of that drain (~20 KB here) and
    batches to the room left."""
    with netns_loopback() as box:
        _shape(box)
        rounds = _send(box, "on", _ENDPOINT_PACER, 3)["rounds"]
    assert rounds[0]["most"] > 512 << 10, rounds  # (the drain not yet seen: four bursts)
    assert all(r["most"] < 64 << 10 for r in rounds[1:]), rounds


def _shape(box: Any) -> None:
    """The namespace's loopback drains at 50 Mbit/s, a NIC's pace, with a queue deep
    enough for whole rounds (nothing dropped)."""
    box.run(["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "50mbit",
             "burst", "3000", "limit", str(16 << 20)])  # fmt: skip
