"""Spraying over paths, as seen on the wire: one UDP source port per path.

A switch spreads flows over equal-cost paths by hashing the L4 header (ECMP),
so DLCP gets its paths by sending each path's packets from a socket of its own,
with its own source port, and sprays a message over them ``spray_packets``
packets (one GSO send) at a time. Two real endpoints in this process move one
message over loopback with ``n_paths=4`` and ``spray_packets=8`` (well under
``batch_packets``, so every pacing batch is cut into several spray batches), and
an AF_PACKET capture of loopback (root) records every data datagram the sender
puts on the wire. Checked:

* the sender's 4 send sockets have 4 distinct source ports;
* every datagram leaves from the socket of the path stamped in its header;
* all 4 ports carry a fair share (>= 10 %) of the datagrams;
* no GSO frame carries more than ``spray_packets`` datagrams, and with one send
  thread no run of consecutive datagrams from one port is longer either: the
  granularity is honoured (with N, N batches' sprays on one path may leave
  back to back: DLCP_ENGINE_THREADS, docs/engine.md);
* the message arrives bit-exact (p = 0).
"""

from __future__ import annotations

import contextlib
import struct
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

from dlcp.io import Endpoint, EndpointConfig
from dlcp.proto.batch import decode_data
from dlcp.proto.config import ProtocolConfig
from dlcp.proto.wire import DATA_HEADER_LEN, Flags
from tests.io.endpoint_helpers import (
    JOB,
    LocalStore,
    LoopbackCapture,
    dlcp_threads,
    root_only,
)
from tests.io.peers import MB4, digest, make_data

N_PATHS = 4
SPRAY = 8
BATCH = 64  # > SPRAY: each pacing batch is sprayed as 8 GSO sends

pytestmark = [pytest.mark.integration, pytest.mark.root, root_only]


@contextlib.contextmanager
def _capturing(udp_dst: int) -> Iterator[list[bytes]]:
    """Frames of UDP to ``udp_dst`` leaving on loopback while the block runs, in wire
    order (each frame once: only as outgoing), and nothing else: other jobs' traffic
    on the machine is filtered out in the kernel (see LoopbackCapture)."""
    cap = LoopbackCapture(udp_dst=udp_dst)
    frames: list[bytes] = []
    try:
        yield frames
    finally:
        frames += cap.stop()
    assert cap.drops == 0, f"the capture's buffer overflowed: {cap.drops} frames dropped"


def _udp_datagrams(frame: bytes, dst_port: int) -> tuple[int, list[bytes]] | None:
    """(source port, DLCP datagrams) of a captured IPv4/UDP frame to ``dst_port``;
    a GSO frame on loopback carries several datagrams one after the other."""
    ip = frame[14:]
    if frame[12:14] != b"\x08\x00" or len(ip) < 28 or ip[0] >> 4 != 4 or ip[9] != 17:
        return None
    ihl = (ip[0] & 0x0F) * 4
    src, dst = struct.unpack_from(">HH", ip, ihl)
    if dst != dst_port:
        return None
    payload, out = ip[ihl + 8 :], []
    while len(payload) >= DATA_HEADER_LEN:
        size = DATA_HEADER_LEN + struct.unpack_from(">H", payload, 24)[0]
        size += 16 if payload[1] & Flags.AUTH else 0
        out.append(payload[:size])
        payload = payload[size:]
    return src, out


def _runs(ports: list[int]) -> list[int]:
    """Lengths of the runs of equal consecutive values."""
    runs: list[int] = []
    for i, port in enumerate(ports):
        if i and port == ports[i - 1]:
            runs[-1] += 1
        else:
            runs.append(1)
    return runs


def test_one_source_port_per_path_and_spray_granularity() -> None:
    store = LocalStore()
    protocol = ProtocolConfig(n_paths=N_PATHS, spray_packets=SPRAY, batch_packets=BATCH)
    cfg = EndpointConfig(protocol=protocol, timeout=20)
    a = Endpoint(0, store=store, world_size=2, job=JOB, config=cfg)
    b = Endpoint(1, store=store, world_size=2, job=JOB, config=EndpointConfig(timeout=20))
    try:
        # one send socket per path, each bound to its own port
        path_ports = [s.getsockname()[1] for s in a._data.send_socks]
        assert len(path_ports) == N_PATHS, path_ports
        assert len(set(path_ports)) == N_PATHS, f"paths share source ports: {path_ports}"
        assert a.address.data_port not in path_ports

        x, _ = make_data("float32", MB4, 7)
        with _capturing(b.address.data_port) as frames:
            rfut = b.recv(src=0, msg=1)
            report = a.send(x, to=1, msg=1, p=0.0).result(timeout=20)
            got = rfut.result(timeout=20)
        senders = a.stats()["engine_threads"] or 1  # (None: the Python engine)
    finally:
        b.close()
        a.close()
    assert dlcp_threads() == []

    assert got.data.dtype == np.float32 and got.data.size == MB4
    assert digest(got.data) == digest(x), "sprayed message did not arrive bit-exact"
    assert got.report.lost_elems == 0, got.report
    assert report.acknowledged_elems == MB4, report

    ports: list[int] = []  # the source port of each data datagram, in wire order
    for frame in frames:
        found = _udp_datagrams(frame, b.address.data_port)
        if found is None:
            continue
        port, datagrams = found
        assert len(datagrams) <= SPRAY, f"a GSO frame of {len(datagrams)} > {SPRAY} datagrams"
        for datagram in datagrams:
            h, _ = decode_data(datagram, job=JOB)
            assert port in path_ports, f"datagram from port {port}, not a path's {path_ports}"
            assert port == path_ports[h.path], (
                f"datagram stamped path {h.path} left from port {port}, "
                f"path {h.path}'s socket has port {path_ports[h.path]}"
            )
            ports.append(port)

    chunks = MB4 * 4 // protocol.chunk_bytes
    assert len(ports) >= chunks, f"captured {len(ports)} data datagrams, message has ~{chunks}"
    share = Counter(ports)
    assert set(share) == set(path_ports), f"only ports {sorted(share)} of {path_ports} used"
    for port in path_ports:
        assert share[port] >= 0.10 * len(ports), (
            f"port {port} carried {share[port]} of {len(ports)}"
        )
    runs = _runs(ports)
    if senders > 1:  # (side by side, a run may be one spray of each thread's batch)
        assert max(runs) <= senders * SPRAY, f"run lengths {Counter(runs)}"
        return
    assert max(runs) <= SPRAY, (
        f"{max(runs)} consecutive datagrams from one port, spray_packets={SPRAY}; "
        f"run lengths {Counter(runs)}"
    )
    assert len(runs) >= len(ports) // SPRAY, "fewer path changes than spray batches"
