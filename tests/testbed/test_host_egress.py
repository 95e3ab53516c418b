"""The hosts' egress serialised at their link's rate (testbed/host_egress.py): the
option and its defaults (no root), and the qdisc on a built testbed: installed at
each host link's rate, queueing a burst rather than dropping it, and removed at
teardown (root)."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlcp.cli import _parser
from testbed import experiments as ex
from testbed.backend import NamespacesBackend
from testbed.bmv2_backend import Bmv2Backend
from testbed.host_egress import (
    HOST_QUEUE_BYTES,
    exempt_source_port,
    host_counters,
    hosts_egress,
)
from testbed.netns import missing_tools
from testbed.switch_profile import SwitchPolicy
from testbed.topology import LinkSpec, Network, Topology, build

MISSING = missing_tools(offloads=True)
needs_root = pytest.mark.skipif(
    bool(MISSING), reason=f"needs {', '.join(MISSING)} (network namespaces)"
)

# --- no root ---------------------------------------------------------------------------


def test_linux_routers_shape_the_hosts_unless_told() -> None:
    config = ex.ExperimentConfig("clean", "dlcp")
    assert config.host_egress == "shaped" and config.name == "clean-dlcp"
    unshaped = ex.ExperimentConfig("clean", "gloo", host_egress="unshaped")
    assert unshaped.name == "clean-gloo-hosts-unshaped"
    # BMv2's links are not shaped, nor are its hosts
    bmv2 = ex.ExperimentConfig("clean", "dlcp", switch="bmv2")
    assert bmv2.host_egress == "unshaped" and bmv2.name == "clean-dlcp-bmv2"


def test_a_host_egress_the_backend_cannot_give_is_refused_in_the_options_words() -> None:
    with pytest.raises(ValueError, match=r"--host-egress 'nic': unknown \(known: shaped, unsh"):
        ex.ExperimentConfig("clean", "dlcp", host_egress="nic")
    with pytest.raises(ValueError, match=r"--host-egress shaped shapes the hosts .* BMv2 links"):
        ex.ExperimentConfig("clean", "dlcp", switch="bmv2", host_egress="shaped")
    t = Topology.default()
    with pytest.raises(ValueError, match="--host-egress 'nic': unknown"):
        NamespacesBackend(t, None, host_egress="nic")
    with pytest.raises(ValueError, match="not available with bmv2 switches"):
        Bmv2Backend(t, SwitchPolicy(), host_egress="shaped")
    assert NamespacesBackend(t, None).host_egress == "shaped"
    assert Bmv2Backend(t, SwitchPolicy()).host_egress == "unshaped"


def test_the_command_line_takes_host_egress() -> None:
    args = _parser().parse_args(
        ["testbed", "run", "--scenario", "clean", "--transport", "gloo", "--host-egress",
         "unshaped"]
    )  # fmt: skip
    assert args.host_egress == "unshaped"
    args = _parser().parse_args(["testbed", "suite"])
    assert args.host_egress is None  # the switch's default
    with pytest.raises(SystemExit):
        _parser().parse_args(["testbed", "up", "--host-egress", "nic"])


def test_rows_keep_their_host_egress_apart(tmp_path: Path) -> None:
    row = dict.fromkeys(ex.CSV_FIELDS, "0") | {"scenario": "clean", "transport": "dlcp",
                                               "ablation": "", "switch": "linux"}  # fmt: skip
    # a row from before the column: its hosts were unshaped
    old_fields = [f for f in ex.CSV_FIELDS if f != "host_egress"]
    with (tmp_path / ex.CSV_NAME).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old_fields, extrasaction="ignore")
        w.writeheader()
        w.writerow(row | {"final_accuracy": "10"})
    ex.append_csv(tmp_path, row | {"final_accuracy": "20", "host_egress": "shaped"})
    ex.append_csv(tmp_path, row | {"final_accuracy": "30", "host_egress": "unshaped"})
    rows = ex.read_csv(tmp_path)
    # the unshaped row replaced the old one (the same settings); the shaped one stays
    assert [(r["host_egress"], r["final_accuracy"]) for r in rows] == [
        ("unshaped", "30"),
        ("shaped", "20"),
    ]


# --- root ------------------------------------------------------------------------------

#: a sender that writes ``nbytes`` in GSO messages of 40 datagrams through one
#: blocking socket with a 4 MB send buffer (SO_SNDBUFFORCE), as DLCP's data
#: sockets have, from a given source port if there is a third argument, and
#: prints how many sends failed
_BURST = r"""
import socket, sys
dst, nbytes = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 32, 4 << 20)
s.bind(("", int(sys.argv[3]) if len(sys.argv) > 3 else 0))
payload = b"x" * (1400 * 40)
errors = 0
for _ in range(nbytes // len(payload)):
    try:
        s.sendmsg([payload], [(socket.SOL_UDP, 103, (1400).to_bytes(2, "little"))], 0, (dst, 9))
    except OSError as exc:
        errors += 1
        print(exc, file=sys.stderr)
print(errors)
"""


def _qdiscs(net: Network, host: str, dev: str) -> list[dict[str, Any]]:
    out = net.run(host, ["tc", "-j", "qdisc", "show", "dev", dev]).stdout
    parsed: list[dict[str, Any]] = json.loads(out or "[]")
    return parsed


@pytest.mark.root
@needs_root
def test_hosts_are_shaped_at_their_link_rate_and_unshaped_at_teardown() -> None:
    # at the experiments' 200 Mbit/s; h2's link has a rate of its own (a [[links]]
    # table), and its host is shaped to that one
    topo = dataclasses.replace(
        Topology.default(),
        link_rate_mbit=200.0,
        link_specs=(LinkSpec(("h2", "leaf1"), link_rate_mbit=5.0),),
    )
    prefix = "dlcpthe"
    with build(topo, prefix=prefix) as net:
        devs = {h: net.ifaces[h][topo.leaf_of(h)] for h in topo.host_names}
        with hosts_egress(net, "shaped"):
            for host, dev in devs.items():
                qdiscs = _qdiscs(net, host, dev)
                (root,) = (q for q in qdiscs if q.get("root"))
                # HTB only sorts: everything to its second class, where the bucket is
                assert root["kind"] == "htb" and root["options"]["default"] == "0x2", root
                (bucket,) = (q for q in qdiscs if q["kind"] == "tbf")
                assert bucket["parent"] == "1:2", bucket
                mbit = 5.0 if host == "h2" else topo.link_rate_mbit
                options = bucket["options"]
                assert options["rate"] == mbit * 1e6 / 8, (host, options)  # bytes/s
                # two frames leave back to back at most (tc rounds to its clock)
                assert 2 * 1500 <= options["burst"] <= 2 * 1514, options
                # the queue: HOST_QUEUE_BYTES at the rate, in microseconds
                latency = HOST_QUEUE_BYTES / (mbit * 1e6 / 8) * 1e6
                assert options["lat"] == pytest.approx(latency, rel=0.01), options
            # a burst faster than h2's 5 Mbit/s waits in h2, none of it dropped
            # there, and leaves at the link's rate: 1.12 MB take about 1.8 s, so most
            # of it is still queued when the sender's last send has returned, as
            # packets: its 20 GSO messages of 40 datagrams were split as queued
            before = host_counters(net)["h2"]
            sent = net.run(
                "h2", [sys.executable, "-c", _BURST, net.host_addr("h3"), str(20 * 56000)]
            )
            after = host_counters(net)["h2"]
            assert sent.stdout.strip() == "0", sent.stderr
            assert after["drops"] == before["drops"]
            assert after["backlog"] > 20, after
            # cross traffic from an exempt source port bypasses the bucket: the
            # same burst adds nothing to what it took in (sent or still queued: the
            # first burst is still leaving)
            assert exempt_source_port(net, "h2", 40123)
            before = host_counters(net)["h2"]
            net.run("h2", [sys.executable, "-c", _BURST, net.host_addr("h3"), str(20 * 56000),
                           "40123"])  # fmt: skip
            after = host_counters(net)["h2"]
            taken = [c["packets"] + c["backlog"] for c in (before, after)]
            assert taken[0] == taken[1], (before, after)
        for host, dev in devs.items():
            assert [q["kind"] for q in _qdiscs(net, host, dev)] == ["noqueue"], host
        assert host_counters(net) == {}
        assert not exempt_source_port(net, "h2", 40123)  # (nothing to bypass)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    assert not [ns for ns in listed.stdout.split() if ns.startswith(prefix)]


@pytest.mark.root
@needs_root
def test_an_unshaped_backend_leaves_the_hosts_at_memory_speed() -> None:
    t = Topology.default()
    backend = NamespacesBackend(t, None, prefix="dlcptheu", host_egress="unshaped")
    with backend.build() as net:
        for host in t.host_names:
            dev = net.ifaces[host][t.leaf_of(host)]
            assert [q["kind"] for q in _qdiscs(net, host, dev)] == ["noqueue"], host
        assert backend.host_counters() == {}
