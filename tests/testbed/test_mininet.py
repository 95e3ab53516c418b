"""The leaf-spine topology under Mininet (``--backend mininet``): root, Debian's
``mnexec`` and the PyPI ``mininet`` package; otherwise these tests skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.mininet_backend import build_mininet, mininet_missing
from testbed.topology import Topology, route_commands

MISSING = mininet_missing()
needs_mininet = pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}")
pytestmark = [needs_mininet, pytest.mark.root]


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_default_topology_under_mininet() -> None:
    t = Topology.default()
    prefix = f"dlcpmn{os.getpid() % 100000}-"
    before_links = _root_links()
    with build_mininet(t, prefix=prefix) as net:
        mn = net.mininet
        pids = [mn[n].pid for n in t.nodes]
        # every node is a plain Mininet host: no switches, no controller
        assert [h.name for h in mn.hosts] == list(t.nodes)
        assert mn.switches == [] and mn.controllers == []
        assert {f"{prefix}{n}" for n in t.nodes} <= _netns()
        # every host pings every other host, through Mininet's own node shells
        for a in t.host_names:
            for b in t.host_names:
                if a != b:
                    out = mn[a].cmd(f"ping -c 1 -W 5 {net.host_addr(b)}")
                    assert " 0% packet loss" in out, (a, b, out)
        # same addresses as the namespace backend; Mininet knows them (CLI: h1 ping h4)
        assert mn["h4"].IP() == net.host_addr("h4") == "10.215.3.2"
        # ECMP on the leaves: every remote host prefix over both spines
        for leaf in t.leaves:
            routes = {r["dst"]: r for r in net.routes(leaf)}
            for h in t.hosts:
                if h.leaf == leaf:
                    continue
                dst = f"10.215.{t.host_index(h.name)}.0/24"
                hops = routes[dst]["nexthops"]
                assert sorted(x["dev"] for x in hops) == sorted(t.spines)
            hash_policy = net.run(leaf, ["sysctl", "-n", "net.ipv4.fib_multipath_hash_policy"])
            assert hash_policy.stdout.strip() == "3"  # the 5-tuple, whatever the skb's hash
        # the installed routes are exactly the shared route table of both backends
        for node, argv in route_commands(t):
            dst = argv[3]
            if dst != "default":
                assert dst in {r["dst"] for r in net.routes(node)}
        # TCLink shaping at the topology rate; segmentation offloads off on hosts
        qd = net.run("h1", ["tc", "qdisc", "show", "dev", "leaf1"]).stdout
        assert "htb 5:" in qd
        cls = net.run("h1", ["tc", "class", "show", "dev", "leaf1"]).stdout
        assert "rate 1Gbit" in cls
        feats = net.run("h1", ["ethtool", "-k", "leaf1"]).stdout
        assert "tx-udp-segmentation: off" in feats
        assert "tcp-segmentation-offload: off" in feats
    # nothing of this network is left; other programs on the machine may have
    # added namespaces or links meanwhile, so only ours are looked for
    assert not {n for n in _netns() if n.startswith(prefix)}
    ours = set(t.nodes)
    left = _root_links() - before_links
    assert not {name for name in left if name.split("@")[0].split("-")[0] in ours}, left
    assert not [p for p in pids if _alive(p)]


def test_leftover_names_of_a_crashed_run_are_replaced() -> None:
    t = Topology.default()
    prefix = f"dlcpmc{os.getpid() % 100000}-"
    subprocess.run(["ip", "netns", "add", f"{prefix}h1"], check=True)
    try:
        with build_mininet(t, prefix=prefix) as net:
            out = net.run("h1", ["ping", "-c", "1", "-W", "5", net.host_addr("h4")])
            assert out.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", f"{prefix}h1"], capture_output=True)
    assert not {n for n in _netns() if n.startswith(prefix)}


def test_cli_up_with_mininet_cli() -> None:
    prefix = f"dlcpmu{os.getpid() % 100000}-"
    proc = subprocess.run(
        [sys.executable, "-m", "dlcp.cli", "testbed", "up", "--backend", "mininet", "--cli",
         "--profile", "dlcp", "--prefix", prefix],
        input="h1 ping -c 1 -W 5 h4\nleaf1 tc qdisc show\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "ready" in proc.stdout
    assert "1 received" in proc.stdout + proc.stderr  # Mininet prints through its log
    # our switch profile on the Mininet routers' egresses: HTB root, a FIFO per class
    qdiscs = proc.stdout + proc.stderr
    assert "qdisc htb 1: " in qdiscs and qdiscs.count("qdisc pfifo") >= 8, qdiscs[-3000:]
    assert "testbed removed" in proc.stdout
    assert not {n for n in _netns() if n.startswith(prefix)}


def test_a_link_with_its_own_rate_is_shaped_at_it(tmp_path: Path) -> None:
    """TCLink shapes each link at its own rate: a ``[[links]]`` override wins."""
    p = tmp_path / "t.toml"
    p.write_text(
        'leaves = ["leaf1"]\nspines = ["spine1"]\nlink_rate_mbit = 200\n[hosts]\nh1 = "leaf1"\n'
        '[[links]]\nbetween = ["leaf1", "spine1"]\nlink_rate_mbit = 50\n'
    )
    t = Topology.load(p)
    with build_mininet(t, prefix=f"dlcpml{os.getpid() % 100000}-") as net:
        def rates(node: str, peer: str) -> str:
            dev = net.ifaces[node][peer]
            return net.run(node, ["tc", "class", "show", "dev", dev]).stdout

        assert "rate 50Mbit" in rates("leaf1", "spine1"), rates("leaf1", "spine1")
        assert "rate 50Mbit" in rates("spine1", "leaf1")
        assert "rate 200Mbit" in rates("leaf1", "h1"), rates("leaf1", "h1")
