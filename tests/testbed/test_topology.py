"""Leaf-spine topology: loading/validation (no root), building, ECMP, cleanup (root)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from testbed.netns import missing_tools
from testbed.topology import DEFAULT_TOPOLOGY, Network, Topology, TopologyError, build

MISSING = missing_tools(offloads=True)
needs_root = pytest.mark.skipif(
    bool(MISSING), reason=f"needs {', '.join(MISSING)} (network namespaces)"
)

BASE: dict[str, Any] = {
    "name": "t",
    "mtu": 1500,
    "leaves": ["leaf1", "leaf2"],
    "spines": ["spine1", "spine2"],
    "hosts": {"h1": {"leaf": "leaf1"}, "h2": {"leaf": "leaf2"}},
}


def _with(**changes: Any) -> dict[str, Any]:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    data.update(changes)
    return data


# --- loading and validation (no root) -------------------------------------------------


def test_default_topology_loads() -> None:
    t = Topology.load(DEFAULT_TOPOLOGY)
    assert t.host_names == ("h1", "h2", "h3", "h4")
    assert t.leaves == ("leaf1", "leaf2")
    assert t.spines == ("spine1", "spine2")
    assert [t.leaf_of(h) for h in t.host_names] == ["leaf1", "leaf1", "leaf2", "leaf2"]
    assert (t.mtu, t.link_rate_mbit, t.buffer_packets) == (1500, 1000.0, 100)
    assert len(t.links()) == 4 + 4
    assert len({t.host_addr(h) for h in t.host_names}) == 4
    assert Topology.default() == t


def test_load_from_file(tmp_path: Path) -> None:
    p = tmp_path / "t.toml"
    p.write_text(
        textwrap.dedent(
            """
            leaves = ["l1"]
            spines = ["s1"]
            mtu = 9000
            [hosts]
            a = "l1"
            b = { leaf = "l1" }
            """
        )
    )
    t = Topology.load(p)
    assert t.host_names == ("a", "b") and t.mtu == 9000 and t.spines == ("s1",)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_with(hosts={"h1": {"leaf": "leaf9"}}), r"hosts\.h1\.leaf: unknown leaf 'leaf9'"),
        (_with(hosts={"h1": {}}), r"hosts\.h1\.leaf: .*on no leaf"),
        (_with(spines=[]), r"spines: .*spine count 0"),
        (_with(leaves=["leaf1", "leaf1"]), r"leaves\.leaf1: duplicate name"),
        (_with(spines=["h1", "spine2"]), r"spines\.h1: duplicate name \(also in hosts\)"),
        (_with(spines=["a_very_long_spine_name"]), r"spines\.a_very_long_spine_name: .*too long"),
        (_with(leaves=["leaf 1"]), r"leaves\.leaf 1: invalid name"),
        (_with(leaves=["lo"]), r"leaves\.lo: invalid name"),
        (_with(mtu=20), r"mtu: must be within"),
        (_with(mtu="big"), r"mtu: must be an integer"),
        (_with(link_rate_mbit=0), r"link_rate_mbit: must be a number from 0\.001 .* got 0"),
        (_with(link_rate_mbit=float("nan")), r"link_rate_mbit: .* got nan"),
        (_with(link_rate_mbit=float("inf")), r"link_rate_mbit: .* got inf"),
        (_with(buffer_packets=-1), r"buffer_packets: must be at least 2 .* got -1"),
        (_with(buffer_packets=1), r"buffer_packets: must be at least 2 .* got 1"),
        (_with(buffer_packets=600_000), r"buffer_packets: queue_packets must be at most 524287"),
        (_with(hosts={}), r"hosts: must be a non-empty table"),
        (_with(hosts={"h1": {"leaf": "leaf1", "rate": 3}}), r"hosts\.h1\.rate: unknown field"),
        (_with(colour="red"), r"colour: unknown field"),
        (_with(spines="spine1"), r"spines: must be a list"),
    ],
)
def test_validation_errors_name_the_field(data: dict[str, Any], match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        Topology.from_dict(data)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text("leaves = [\n")
    with pytest.raises(TopologyError, match=r"bad\.toml: not valid TOML"):
        Topology.load(p)
    p.write_text('leaves = ["l1"]\nspines = []\n[hosts]\nh1 = "l1"\n')
    with pytest.raises(TopologyError, match=r"bad\.toml: spines:"):
        Topology.load(p)
    with pytest.raises(TopologyError, match="cannot read"):
        Topology.load(tmp_path / "absent.toml")
    p.write_bytes(b"\xff\xfe leaves = []\n")  # not UTF-8
    with pytest.raises(TopologyError, match=r"bad\.toml: not valid TOML \(UTF-8\)"):
        Topology.load(p)


# --- building (root) ------------------------------------------------------------------

RECEIVER = textwrap.dedent(
    """
    import socket, sys
    want = int(sys.argv[1])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    # room for the whole burst while this process waits for a core (SO_RCVBUFFORCE)
    s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)
    s.bind(("0.0.0.0", 9000))
    s.settimeout(3.0)
    print("ready", flush=True)
    n = 0
    try:
        while n < want:
            s.recv(2048)
            n += 1
    except TimeoutError:
        pass
    print(n, flush=True)
    """
)

SENDER = textwrap.dedent(
    """
    import socket, sys
    dst, ports, per_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    socks = []
    for i in range(ports):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", 41000 + i))
        socks.append(s)
    payload = b"x" * 1000
    for _ in range(per_port):
        for s in socks:
            s.sendto(payload, (dst, 9000))
    """
)


def _netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _spine_tx(net: Network) -> dict[str, int]:
    """Packets each spine sent towards leaf2 (where h3 hangs)."""
    return {s: net.link_counters(s, "leaf2")[0] for s in net.topology.spines}


def _send_udp(net: Network, ports: int, per_port: int) -> tuple[dict[str, int], int]:
    """h1 -> h3 UDP from ``ports`` source ports; returns per-spine packet deltas
    and what the receiver on h3 counted."""
    total = ports * per_port
    before = _spine_tx(net)
    recv = subprocess.Popen(
        net.exec_argv("h3", [sys.executable, "-c", RECEIVER, str(total)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert recv.stdout is not None
        assert recv.stdout.readline().strip() == "ready"
        net.run(
            "h1", [sys.executable, "-c", SENDER, net.host_addr("h3"), str(ports), str(per_port)]
        )
        out, _ = recv.communicate(timeout=10)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    after = _spine_tx(net)
    return {s: after[s] - before[s] for s in after}, int(out.strip())


@pytest.mark.root
@needs_root
def test_build_default_ecmp_and_cleanup() -> None:
    topo = Topology.default()
    prefix = "dlcpt1"
    with build(topo, prefix=prefix) as net:
        # every host reaches every other host (build checked it too)
        assert len(net.namespaces) == 8
        assert set(_netns_list()) >= set(net.namespaces)
        for a in topo.host_names:
            for b in topo.host_names:
                if a != b:
                    net.run(a, ["ping", "-c", "1", "-W", "2", "-q", net.host_addr(b)])
        # hosts send real MTU-sized packets
        feats = net.run("h1", ["ethtool", "-k", "leaf1"]).stdout
        assert "tx-udp-segmentation: off" in feats
        assert "tcp-segmentation-offload: off" in feats
        assert "generic-segmentation-offload: off" in feats
        assert net.run("h1", ["ip", "link", "show", "dev", "leaf1"]).stdout.count("mtu 1500") == 1

        # many source ports: both spines carry a substantial share. A first round
        # resolves the routers' neighbours on both paths, so that the measured one
        # does not queue behind ARP (whose queue holds only ~200 KB)
        _send_udp(net, ports=64, per_port=1)
        deltas, received = _send_udp(net, ports=64, per_port=4)
        total = 64 * 4
        assert received == total
        assert sum(deltas.values()) >= total
        for spine, n in deltas.items():
            assert n > 0.15 * total, f"{spine} forwarded only {n} of {total}: {deltas}"

        # one source port: every packet takes the same spine
        deltas, received = _send_udp(net, ports=1, per_port=100)
        assert received == 100
        assert sorted(deltas.values())[0] <= 2, deltas  # allow stray ARP
        assert sorted(deltas.values())[-1] >= 100, deltas
    assert not [ns for ns in _netns_list() if ns.startswith(prefix)]


@pytest.mark.root
@needs_root
def test_rebuild_after_crash_and_cleanup_on_error() -> None:
    prefix = "dlcpt2"
    topo = Topology.from_dict(
        {"leaves": ["l1", "l2"], "spines": ["s1"], "hosts": {"a": "l1", "b": "l2"}}
    )
    # a crashed run left a namespace (with an interface) behind
    subprocess.run(["ip", "netns", "add", f"{prefix}a"], check=True)
    subprocess.run(
        ["ip", "-n", f"{prefix}a", "link", "add", "l1", "type", "veth", "peer", "x"], check=True
    )
    try:
        with build(topo, prefix=prefix) as net:
            net.run("a", ["ping", "-c", "1", "-W", "2", "-q", net.host_addr("b")])
            raise KeyError("boom")  # an error inside the context
    except KeyError:
        pass
    assert not [ns for ns in _netns_list() if ns.startswith(prefix)]
    # and once more: a clean second build with the same prefix works
    with build(topo, prefix=prefix) as net:
        assert net.routes("l1")
    assert not [ns for ns in _netns_list() if ns.startswith(prefix)]


@pytest.mark.root
@needs_root
def test_build_a_larger_topology_from_its_file() -> None:
    """The 8-host, 4-leaf, 3-spine file shipped beside the default builds the
    same way: every namespace, every host reachable (build checks it), ECMP
    spreading flows over all three spines, and nothing left behind."""
    topo = Topology.load(DEFAULT_TOPOLOGY.parent / "leaf_spine_8h.toml")
    assert (len(topo.hosts), len(topo.leaves), len(topo.spines)) == (8, 4, 3)
    prefix = "dlcpt8"
    with build(topo, prefix=prefix) as net:
        assert len(net.namespaces) == 15
        assert set(_netns_list()) >= set(net.namespaces)
        net.run("h1", ["ping", "-c", "1", "-W", "2", "-q", net.host_addr("h8")])
        _send_udp(net, ports=96, per_port=1)  # resolve neighbours on every path first
        deltas, received = _send_udp(net, ports=96, per_port=4)
        total = 96 * 4
        assert received == total
        for spine, n in deltas.items():
            assert n > 0.12 * total, f"{spine} forwarded only {n} of {total}: {deltas}"
    assert not [ns for ns in _netns_list() if ns.startswith(prefix)]


def test_links_override_rate_and_buffer(tmp_path: Path) -> None:
    p = tmp_path / "t.toml"
    p.write_text(
        'leaves = ["leaf1", "leaf2"]\nspines = ["spine1"]\nlink_rate_mbit = 200\n'
        "buffer_packets = 100\n"
        '[hosts]\nh1 = "leaf1"\nh2 = "leaf2"\n'
        '[[links]]\nbetween = ["spine1", "leaf2"]\nlink_rate_mbit = 50\n'
        '[[links]]\nbetween = ["h1", "leaf1"]\nbuffer_packets = 30\n'
    )
    t = Topology.load(p)
    assert t.link_spec("leaf2", "spine1") == t.link_spec("spine1", "leaf2")
    assert t.link_spec("leaf1", "spine1") is None
    from testbed.impairments import link_policy
    from testbed.switch_profile import SwitchPolicy

    base = SwitchPolicy(link_rate_mbit=200, queue_packets=100, drop_eligible_packets=20)
    slow = link_policy(base, t.link_spec("leaf2", "spine1"))
    assert (slow.link_rate_mbit, slow.queue_packets) == (50, 100)
    short = link_policy(base, t.link_spec("leaf1", "h1"))
    assert isinstance(short, SwitchPolicy)
    assert (short.link_rate_mbit, short.queue_packets, short.drop_eligible_packets) == (200, 30, 6)
    assert link_policy(base, None) is base


@pytest.mark.parametrize(
    ("links", "match"),
    [
        ('[[links]]\nbetween = ["h1", "spine1"]\n', "h1 and spine1 share no link"),
        ('[[links]]\nbetween = ["h1", "leaf9"]\n', "unknown node 'leaf9'"),
        ('[[links]]\nbetween = ["h1"]\n', "two node names"),
        ('[[links]]\nbetween = ["h1", "leaf1"]\nlink_rate_mbit = 0\n',
         r"links\[0\]\.link_rate_mbit: must be a number from 0\.001"),
        ('[[links]]\nbetween = ["h1", "leaf1"]\nlink_rate_mbit = nan\n',
         r"links\[0\]\.link_rate_mbit: .* got nan"),
        ('[[links]]\nbetween = ["h1", "leaf1"]\nbuffer_packets = 1\n',
         r"links\[0\]\.buffer_packets: must be at least 2"),
        ('[[links]]\nbetween = ["h1", "leaf1"]\nspeed = 1\n', "speed: unknown field"),
        ('[[links]]\nbetween = ["h1", "leaf1"]\n[[links]]\nbetween = ["leaf1", "h1"]\n',
         "given twice"),
    ],
)  # fmt: skip
def test_link_override_errors_name_the_field(tmp_path: Path, links: str, match: str) -> None:
    p = tmp_path / "t.toml"
    p.write_text('leaves = ["leaf1"]\nspines = ["spine1"]\n[hosts]\nh1 = "leaf1"\n' + links)
    with pytest.raises(TopologyError, match=match):
        Topology.load(p)


@pytest.mark.root
@needs_root
def test_a_link_override_reaches_the_routers_queues(tmp_path: Path) -> None:
    from testbed.impairments import apply_profile
    from testbed.switch_profile import SwitchPolicy

    p = tmp_path / "t.toml"
    p.write_text(
        DEFAULT_TOPOLOGY.read_text()
        + '\n[[links]]\nbetween = ["spine1", "leaf2"]\nlink_rate_mbit = 50\n'
    )
    prefix = "dlcpt9"
    with build(Topology.load(p), prefix=prefix) as net:
        apply_profile(net, SwitchPolicy(link_rate_mbit=200))
        for router, nb in (("spine1", "leaf2"), ("leaf2", "spine1"), ("spine2", "leaf2")):
            out = net.run(router, ["tc", "class", "show", "dev", net.ifaces[router][nb]]).stdout
            want = "50Mbit" if "spine2" not in (router, nb) else "200Mbit"
            assert f"rate {want} ceil {want}" in out, (router, nb, out)
    assert not [ns for ns in _netns_list() if ns.startswith(prefix)]


def test_segmentation_left_on_reads_ethtool() -> None:
    from testbed.netns import NetnsError, require_segmentation_off, segmentation_left_on

    out = (
        "Features for h1-leaf1:\n"
        "tcp-segmentation-offload: off\n"
        "\ttx-tcp-segmentation: off\n"
        "generic-segmentation-offload: on\n"
        "tx-udp-segmentation: on [fixed]\n"
        "generic-receive-offload: on\n"
    )
    assert segmentation_left_on(out) == ["generic-segmentation-offload", "tx-udp-segmentation"]
    assert segmentation_left_on(out.replace(": on", ": off")) == []

    class _Done:
        stdout = out

    with pytest.raises(NetnsError, match="eth9 still has generic-segmentation-offload"):
        require_segmentation_off(lambda argv: _Done(), "eth9", "ns1")


@pytest.mark.root
@needs_root
def test_hosts_give_tcp_the_minimum_rto_of_dlcps_control_connections() -> None:
    """Gloo's TCP on the testbed waited Linux's 200 ms for a lost segment while DLCP's
    control connections wait ``control_rto_min`` (5 ms): every host's namespace now
    sets that minimum for all its TCP sockets; the routers keep the kernel's."""
    if not Path("/proc/sys/net/ipv4/tcp_rto_min_us").exists():
        pytest.skip("this kernel has no net.ipv4.tcp_rto_min_us")
    from dlcp.io import EndpointConfig

    want = str(round(EndpointConfig.from_env().control_rto_min * 1e6))
    with build(Topology.default(), prefix="dlcpt7") as net:
        for host in net.topology.host_names:
            got = net.run(host, ["sysctl", "-n", "net.ipv4.tcp_rto_min_us"]).stdout.strip()
            assert got == want, (host, got)
        spine = net.run("spine1", ["sysctl", "-n", "net.ipv4.tcp_rto_min_us"]).stdout.strip()
        assert spine == "200000"
