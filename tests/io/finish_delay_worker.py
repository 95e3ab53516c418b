"""Run as root in a network namespace of its own, its loopback up
(``testbed.netns.netns_loopback``): the native engine sends a round to a receiver on
the loopback, which tbf shapes to 20 Mbit/s so that the host's queue holds the round's
datagrams when the round ends, with the round's FINISH on a stream socket pair (not
shaped). Prints one JSON line: when the round ended (the report's ``ended_t``) and when
its FINISH came, monotonic seconds, and whether the engine wrote it."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import numpy as np

from dlcp.io.extensions import load


def main() -> None:
    subprocess.run(
        ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "20mbit", "burst", "16kb",
         "latency", "2s"],
        check=True,
    )  # fmt: skip
    native = load("_engine")
    assert native is not None
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    mine, theirs = socket.socketpair()
    mine.setblocking(False)
    engine = native.Engine([tx.fileno()], 8, "dlcp-send-test")
    try:
        # paced above the link: the host's queue fills up to the engine's limit
        engine.add_peer(1, "127.0.0.1", rx.getsockname()[1],
                        native.Pacer(initial_rate=10e6, min_rate=1e6))  # fmt: skip
        engine.adopt_control(1, mine.fileno())
        count, stride = 200, 1000
        zeros = np.zeros(count, np.uint8)
        finish = b"\x00\x00\x00\x04done"
        engine.post(
            dst=1, step=0, msg=0, order=1, records=np.ones((count, stride), np.uint8),
            stride=stride, per_message=1, count=count, short=-1, short_len=stride, tos=zeros,
            path=zeros, prio=zeros, breaks=np.array([count], np.int64), finish=finish,
        )  # fmt: skip
        theirs.settimeout(30)
        assert theirs.recv(100) == finish
        came = time.monotonic()
        (report,) = engine.reap()
        print(json.dumps({"ended": report[10], "finish": came, "finish_sent": report[9]}))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
