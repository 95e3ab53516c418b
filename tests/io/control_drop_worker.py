"""Run inside a fresh network namespace by ``test_control_loss.py``: two control
channels on its loopback, an nftables rule that drops one marked control frame
exactly once (its retransmission passes), and the time that frame took to
arrive, printed as JSON. Usage: ``control_drop_worker.py RTO_MIN_SECONDS``."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time

from dlcp.io.control import ControlChannel

MARK = b"LOSE"  # the frame the rule drops starts with these bytes


def _rule(port: int) -> str:
    # @ih = the TCP payload: after the 4-byte frame length comes the frame;
    # numgen inc counts the matching packets, so only the first one is dropped
    return (
        "table inet ctl_drop {\n"
        "  chain input {\n"
        "    type filter hook input priority -100; policy accept;\n"
        f"    tcp dport {port} @ih,32,32 0x{MARK.hex()} numgen inc mod 1000000 0 counter drop\n"
        "  }\n"
        "}\n"
    )


def _dropped() -> int:
    out = subprocess.run(
        ["nft", "list", "table", "inet", "ctl_drop"], capture_output=True, text=True, check=True
    ).stdout
    words = next(line for line in out.splitlines() if "counter packets" in line).split()
    return int(words[words.index("packets") + 1])


def _frames(rx: ControlChannel, conn: socket.socket, n: int) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 5.0
    while len(got) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(got)} of {n} frames arrived in 5 s")
        select.select([conn], [], [], 0.5)
        frames, ended = rx.read(conn)
        if ended is not None:
            raise SystemExit(f"the control connection ended: {ended}")
        got += frames
    return got


def main() -> None:
    rto_min = float(sys.argv[1])
    tx = ControlChannel("127.0.0.1", 0, rank=0, job=1, connect_timeout=2.0, rto_min=rto_min)
    rx = ControlChannel("127.0.0.1", 0, rank=1, job=1, connect_timeout=2.0, rto_min=rto_min)
    try:
        subprocess.run(["nft", "-f", "-"], input=_rule(rx.address[1]), text=True, check=True)
        assert tx.send(1, rx.address, b"first") is None  # connects, says hello
        select.select([rx.listener], [], [], 5.0)
        conn = rx.accept()
        assert conn is not None, "the connection did not arrive"
        _frames(rx, conn, 1)
        started = time.monotonic()
        assert tx.send(1, rx.address, MARK + b" me once") is None
        (frame,) = _frames(rx, conn, 1)
        seconds = time.monotonic() - started
        print(json.dumps({"seconds": seconds, "frame": frame[1].decode(), "dropped": _dropped()}))
    finally:
        tx.close()
        rx.close()


if __name__ == "__main__":
    main()
