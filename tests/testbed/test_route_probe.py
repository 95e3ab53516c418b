"""Route probes on a real leaf-spine network: the paths' source ports hash onto
the spines as they fall, and DLCP evens the routes out (dlcp.io.path_probe).

On the default testbed topology (two leaves, two spines, ECMP on the 5-tuple),
a sender on h1 with 16 paths probes its routes to h3, on the other leaf: every
path traced has the three hops leaf1, a spine, leaf2; both spines appear; the
weights give each route the same share; and an 8 MB message then crosses
the two spines as the weights say, whatever the hash did with the ports. The
receiver sees no probe (none is sent with a TTL that reaches it): it rejects
nothing.

The ports are random and so is the kernel's hash key, so all paths land on one
spine with probability 2 / 2**n_paths: with 8 paths (1 run in 128) a CI run
failed that way; 16 make it 1 in 32,768. The routers keep Linux's limit on the
ICMP errors they send (a burst of 6 to a destination, then one a second), which
16 paths, each asking every hop, run into: the prober asks each hop up to once
per path (``default_attempts``), about 30 s here. A path still left untraced
keeps an equal path's share on a route nobody knows (tests/proto/test_paths.py),
so the split allowed is each route's share, plus the untraced paths' if any,
within 0.1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.netns import missing_tools
from testbed.topology import Network, Topology, build

MISSING = missing_tools(offloads=True)
pytestmark = [
    pytest.mark.root,
    pytest.mark.integration,
    pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (network namespaces)"),
]

WORKER = str(Path(__file__).with_name("route_probe_worker.py"))


def _spine_tx(net: Network) -> dict[str, int]:
    """Packets each spine has sent towards leaf2 (where h3 hangs)."""
    return {s: net.link_counters(s, "leaf2")[0] for s in net.topology.spines}


def _start(net: Network, host: str, role: str) -> subprocess.Popen[str]:
    argv = [sys.executable, WORKER, role, net.host_addr("h1"), net.host_addr("h3")]
    return subprocess.Popen(
        net.exec_argv(host, argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def test_probed_routes_even_out_the_spines() -> None:
    topo = Topology.default()
    with build(topo, prefix="dlcptr") as net:
        started = [_start(net, "h3", "receiver")]
        receiver = started[0]
        try:
            assert receiver.stdout is not None
            assert receiver.stdout.readline().strip() == "ready"
            started.append(sender := _start(net, "h1", "sender"))
            assert sender.stdout is not None and sender.stdin is not None
            found = json.loads(sender.stdout.readline())
            before = _spine_tx(net)
            sender.stdin.write("go\n")
            sender.stdin.flush()
            assert sender.stdout.readline().strip() == "sent"
            after = _spine_tx(net)
            out, _ = receiver.communicate(timeout=150)
            assert sender.wait(timeout=150) == 0 and receiver.returncode == 0
        finally:
            for p in started:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    assert found["distance"] == 4  # h1 -> leaf1 -> spine -> leaf2 -> h3
    traced = [tuple(r) for r in found["routes"] if r is not None]
    assert len(traced) >= 14, found  # (a probe or its answer may still be lost)
    assert all(len(r) == 3 for r in traced), found
    assert len(set(traced)) == 2, found  # one route per spine
    weights = found["weights"]
    per_route: dict[tuple[str, ...], float] = {}
    untraced = 0.0  # the share of the paths whose route is not known
    for route, w in zip(found["routes"], weights, strict=True):
        if route is not None:
            per_route[tuple(route)] = per_route.get(tuple(route), 0.0) + w
        else:
            untraced += w
    shares = sorted(per_route.values())
    assert shares[0] == pytest.approx(shares[1])
    crossed = {s: after[s] - before[s] for s in after}
    total = sum(crossed.values())
    assert total >= (8 << 20) // 1500, crossed
    low, high = shares[0] - 0.1, shares[0] + untraced + 0.1
    for spine, n in crossed.items():
        assert low * total <= n <= high * total, f"{spine} carried {n} of {total}: {crossed}"
    # where the hash split the ports unevenly enough (45 % of runs), the split is
    # the weights', not the one equal shares per port would have made
    ports = [sum(tuple(r) == route for r in traced) / len(weights) for route in per_route]
    if not untraced and 0.5 - min(ports) >= 0.1:
        measured = min(crossed.values()) / total
        assert abs(measured - shares[0]) < abs(measured - min(ports)), (crossed, ports)
    assert not any(json.loads(out)["rejected"].values()), out
