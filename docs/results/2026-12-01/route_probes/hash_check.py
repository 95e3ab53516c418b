"""Which spine each of three sockets bound to one port reaches: an unconnected one
(as a DLCP path socket is), a connected one, and a second unconnected one; 200
datagrams each, counted on the spines' links to leaf2. Run as root inside a testbed
host while ``dlcp testbed up`` (prefix ``dlcptb-``) holds the testbed:

    ip netns exec dlcptb-h1 python hash_check.py
"""

import contextlib
import json
import socket
import subprocess

SRC, DST = "10.215.0.2", ("10.215.2.2", 40000)  # h1, h3 (other leaf)


def spine_tx() -> dict[str, int]:
    out = {}
    for spine in ("spine1", "spine2"):
        argv = ["ip", "-n", f"dlcptb-{spine}", "-s", "-j", "link", "show", "dev", "leaf2"]
        link = json.loads(subprocess.run(argv, capture_output=True, text=True).stdout)
        out[spine] = link[0]["stats64"]["tx"]["packets"]
    return out


def spine_of(sock: socket.socket, connected: bool) -> str:
    before = spine_tx()
    for _ in range(200):
        with contextlib.suppress(OSError):  # (the port unreachable answer to an earlier one)
            sock.send(b"x" * 100) if connected else sock.sendto(b"x" * 100, DST)
    after = spine_tx()
    return max(after, key=lambda s: after[s] - before[s])


def shared(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((SRC, port))
    return s


for _ in range(6):
    path = shared(0)
    port = path.getsockname()[1]
    connected = shared(port)
    connected.connect(DST)
    other = shared(port)
    print(
        f"port {port}: unconnected {spine_of(path, False)}, connected "
        f"{spine_of(connected, True)}, second unconnected {spine_of(other, False)}"
    )
    for s in (path, connected, other):
        s.close()
