"""``python -m dlcp.bench.transport``, run as a user would: small, on loopback.

The benchmark's contract with its users (and with the scripts that collect its
figures) is its command line and the last line of its stdout with ``--json``:
one JSON object with every figure. This runs it end to end with a 4 MiB tensor
and checks that contract: it exits 0, the last line parses, the keys the
documentation and the result tables rely on are there, the path and loss method
are what the module docstring promises for ``--loopback`` (the in-process loss
emulator, and TCP's loss fields null since TCP cannot be compared under emulated
loss), and the lossless figures are positive numbers. As root it also runs in
the namespaces with kernel loss, where the UDP floor (every byte sent once with
no protocol) is measured beside both transports. No figure is compared with a
speed: this is not a performance check.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from dlcp.io import EndpointConfig
from dlcp.io.engine import send_threads
from testbed import netns
from tests.bench.bench_helpers import positive, run_json

pytestmark = pytest.mark.integration

SIZE_MIB = 4
TIMEOUT = 120.0  # seconds; a run this small takes about one

ARGV = [
    sys.executable,
    "-m",
    "dlcp.bench.transport",
    "--json",
    "--loopback",
    "--size-mib",
    str(SIZE_MIB),
    "--repetitions",
    "3",
    "--lossless-repetitions",
    "2",
    "--no-progress",
]

KEYS = {
    "size_bytes",
    "dlcp_lossless_gbps",
    "tcp_lossless_gbps",
    "ratio_lossless",
    "dlcp_loss_median_s",
    "tcp_loss_median_s",
    "dlcp_loss_p99_s",
    "tcp_loss_p99_s",
    "ratio_loss_median",
    "ratio_loss_p99",
    "loss_method",
    "path",
}
TCP_LOSS_FIELDS = ("tcp_loss_median_s", "tcp_loss_p99_s", "ratio_loss_median", "ratio_loss_p99")


def _run_benchmark(argv: list[str] = ARGV) -> dict[str, Any]:
    return run_json(argv, TIMEOUT)


def test_transport_benchmark_json_on_loopback() -> None:
    report = _run_benchmark()
    missing = KEYS - report.keys()
    assert not missing, f"keys missing from the JSON line: {sorted(missing)}"
    assert report["path"] == "loopback", report["path"]
    # loopback's 64 KiB MTU is no link: DLCP keeps --mtu's 1500 there, not DLCP_MTU=auto's
    assert report["dlcp_config"]["mtu"] == 1500, report["dlcp_config"]
    assert report["size_bytes"] == SIZE_MIB << 20, report["size_bytes"]
    # the sender's engine and send threads as its endpoint runs them (two workers, no
    # LOCAL_WORLD_SIZE: "auto" runs one thread, DLCP_ENGINE_THREADS what it says)
    threads = send_threads(EndpointConfig.from_env().engine_threads, {})
    native = report["engine"] == "native"
    assert report["engine_threads"] == (threads if native else None), report["engine_threads"]
    for key in ("dlcp_lossless_gbps", "tcp_lossless_gbps", "ratio_lossless"):
        positive(report, key)

    # --loopback: DLCP's in-process loss emulator, and (docstring) TCP cannot be
    # compared under emulated loss, so its loss fields are null; DLCP's are measured
    assert report["loss_method"] == "emulated", report["loss_method"]
    for key in TCP_LOSS_FIELDS:
        assert report[key] is None, f"{key} = {report[key]!r} under emulated loss, want null"
    for key in ("dlcp_loss_median_s", "dlcp_loss_p99_s"):
        positive(report, key)
    assert report["dlcp_loss_p99_s"] >= report["dlcp_loss_median_s"], report
    # transfer by transfer: the sender's rounds (one at least), the control's resent segments
    n = len(report["dlcp_loss_seconds"])
    assert len(report["dlcp_loss_rounds"]) == n and min(report["dlcp_loss_rounds"]) >= 1, report
    assert len(report["dlcp_loss_control_resent_segs"]) == n, report
    # the UDP floor needs kernel loss (root): null here
    assert report["udp_floor_loss_median_s"] is None, report["udp_floor_loss_median_s"]
    assert report["udp_floor_ratio_loss_median"] is None


NETNS_MISSING = netns.missing_tools(loss=True, offloads=True)


@pytest.mark.root
@pytest.mark.skipif(bool(NETNS_MISSING), reason=f"needs {NETNS_MISSING} (network namespaces)")
def test_transport_benchmark_in_namespaces_measures_the_udp_floor() -> None:
    report = _run_benchmark([a for a in ARGV if a != "--loopback"])
    assert report["path"] == "netns-router-veth-mtu1500", report["path"]
    assert report["loss_method"] == "nftables", report["loss_method"]
    for key in (*TCP_LOSS_FIELDS, "udp_floor_loss_median_s", "udp_floor_offloads_off_gbps"):
        positive(report, key)
    # the floor's ratio is its median over TCP's, as the JSON says: the ratio is taken
    # from the unrounded medians (3 decimals), the medians are given to 4 decimals,
    # which on a short transfer is a few per cent of each
    floor_s, tcp_s = report["udp_floor_loss_median_s"], report["tcp_loss_median_s"]
    want = floor_s / tcp_s
    slack = 0.0005 + want * (0.5e-4 / floor_s + 0.5e-4 / tcp_s) * 1.01
    assert abs(report["udp_floor_ratio_loss_median"] - want) <= slack, report
    # the router dropped some of the floor's datagrams, and only a few percent
    assert report["nft_dropped"]["floor"] > 0, report["nft_dropped"]
    delivered = report["udp_floor_loss_delivered_fraction"]
    assert 0.9 < delivered < 1.0, delivered
    assert report["udp_floor_loss_min_s"] <= report["udp_floor_loss_median_s"]
    assert report["udp_floor_senders"] == 1, report["udp_floor_senders"]


@pytest.mark.root
@pytest.mark.skipif(bool(NETNS_MISSING), reason=f"needs {NETNS_MISSING} (network namespaces)")
def test_transport_benchmark_on_jumbo_links_sizes_dlcp_datagrams_from_them() -> None:
    """``--mtu 9000``: the namespaces' links carry jumbo frames and DLCP, left to
    DLCP_MTU=auto, reads that MTU from its interface: 8,940-byte payloads (9000
    less the IPv4, UDP and DLCP headers), every transfer exact."""
    argv = [a for a in ARGV if a != "--loopback"] + ["--mtu", "9000"]
    report = _run_benchmark(argv)
    assert report["path"] == "netns-router-veth-mtu9000", report["path"]
    assert report["dlcp_config"]["mtu"] == 9000, report["dlcp_config"]
    assert report["dlcp_config"]["payload_bytes"] == 9000 - 20 - 8 - 32, report["dlcp_config"]
    for key in ("dlcp_lossless_gbps", "tcp_lossless_gbps", *TCP_LOSS_FIELDS):
        positive(report, key)
