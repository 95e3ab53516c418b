"""``dlcp.io.path_mtu``: DLCP_MTU=auto sizes datagrams from the endpoint's interface.

The interface's MTU is read back independently from ``/sys/class/net`` (the
kernel's own view), and as root a namespace holds interfaces of chosen MTUs
(jumbo, overlay-sized, below the protocol's minimum) to find by address.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from dlcp.errors import ConfigError
from dlcp.io import Endpoint, EndpointConfig
from dlcp.io.path_mtu import MAX_AUTO_MTU, interface_of, mtu_for_host, sized_for_interface
from testbed import netns


def _sys_mtu(name: str) -> int:
    return int(Path(f"/sys/class/net/{name}/mtu").read_text())


def test_loopback_addresses_are_the_loopback_interfaces_capped_at_jumbo_size() -> None:
    # every 127/8 address is lo's, though SIOCGIFCONF lists 127.0.0.1 only
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("127.0.0.2") == "lo"
    assert mtu_for_host("127.0.0.1") == min(_sys_mtu("lo"), MAX_AUTO_MTU)


def test_an_address_no_interface_holds_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"DLCP_MTU=auto: .*address 192\.0\.2\.213"):
        mtu_for_host("192.0.2.213")


def test_dlcp_mtu_auto_asks_for_the_interface_and_numbers_stay_numbers() -> None:
    auto = EndpointConfig.from_env({"DLCP_MTU": "auto"})
    assert auto.mtu_from_interface
    assert not EndpointConfig.from_env({}).mtu_from_interface
    fixed = EndpointConfig.from_env({"DLCP_MTU": "9000"})
    assert (fixed.mtu_from_interface, fixed.protocol.mtu) == (False, 9000)
    with pytest.raises(ConfigError, match="DLCP_MTU='jumbo'"):
        EndpointConfig.from_env({"DLCP_MTU": "jumbo"})


def test_sized_for_interface_replaces_only_the_mtu() -> None:
    cfg = EndpointConfig(mtu_from_interface=True, timeout=7.0)
    sized = sized_for_interface(cfg)
    assert sized.protocol.mtu == mtu_for_host("127.0.0.1")
    assert sized.timeout == 7.0
    assert dataclasses.replace(sized.protocol, mtu=cfg.protocol.mtu) == cfg.protocol
    plain = EndpointConfig()
    assert sized_for_interface(plain) is plain


def test_an_endpoint_with_mtu_auto_reports_the_size_it_uses() -> None:
    ep = Endpoint(
        0, {1: ("127.0.0.1", 9, 9)}, config=EndpointConfig(mtu_from_interface=True, timeout=5.0)
    )
    try:
        assert ep.config.protocol.mtu == min(_sys_mtu("lo"), MAX_AUTO_MTU)
        assert ep.config.protocol.chunk_bytes == ep.config.protocol.mtu - 20 - 8 - 32
    finally:
        ep.close()


_MISSING = netns.missing_tools()
_PROBE = "from dlcp.io.path_mtu import mtu_for_host as m; import sys; print(m(sys.argv[1]))"
_ADDRESS = "10.213.99.1"
needs_namespaces = pytest.mark.skipif(
    os.geteuid() != 0 or bool(_MISSING), reason=f"needs root and {_MISSING}"
)


def _probe_in_namespace(mtu: int) -> subprocess.CompletedProcess[str]:
    """``mtu_for_host`` run in a namespace of this test's own, which holds a veth
    interface ``d0`` of ``mtu`` with address :data:`_ADDRESS` (removed after)."""
    ns = f"dlcp-mtu-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (
            ["link", "add", "d0", "type", "veth", "peer", "name", "d1"],
            ["link", "set", "d0", "mtu", str(mtu), "up"],
            ["link", "set", "d1", "up"],
            ["addr", "add", f"{_ADDRESS}/24", "dev", "d0"],
        ):
            subprocess.run(["ip", "-n", ns, *cmd], check=True)
        return subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-c", _PROBE, _ADDRESS],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=True)


@pytest.mark.root
@needs_namespaces
@pytest.mark.parametrize(("mtu", "want"), [(9000, 9000), (1450, 1450), (16000, MAX_AUTO_MTU)])
def test_an_interface_in_a_namespace_gives_its_mtu(mtu: int, want: int) -> None:
    """The endpoint's address finds its interface (an overlay's 1450 as well as
    jumbo frames; above 9000 the cap)."""
    out = _probe_in_namespace(mtu)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) == want


@pytest.mark.root
@needs_namespaces
def test_an_interface_below_the_protocols_minimum_is_refused_by_name() -> None:
    out = _probe_in_namespace(500)
    assert out.returncode != 0
    assert f"interface d0 (address {_ADDRESS}) has MTU 500" in out.stderr, out.stderr


def test_ranks_whose_datagram_sizes_differ_still_talk() -> None:
    """A receiver takes each message's datagram size from its headers: jumbo
    datagrams reach an endpoint configured for 1500 bytes, and back, exact."""
    import numpy as np

    from dlcp.proto.config import ProtocolConfig
    from tests.io.endpoint_helpers import JOB, LocalStore

    store = LocalStore()
    jumbo = Endpoint(
        0,
        store=store,
        world_size=2,
        job=JOB,
        config=EndpointConfig(protocol=ProtocolConfig(mtu=9000), timeout=20.0),
    )
    plain = Endpoint(1, store=store, world_size=2, job=JOB, config=EndpointConfig(timeout=20.0))
    try:
        x = np.random.default_rng(7).standard_normal(300_001).astype(np.float32)
        for src, dst, step in ((jumbo, plain, 1), (plain, jumbo, 2)):
            before = dst.stats()["datagrams_in"]
            sent = src.send(x, to=dst.rank, msg=1, step=step)
            got = dst.recv(src=src.rank, msg=1, step=step).result(20)
            assert sent.result(20).acknowledged_elems == x.size
            assert np.array_equal(got.data, x)
            chunk = src.config.protocol.chunk_bytes
            assert dst.stats()["datagrams_in"] - before >= -(-x.nbytes // chunk)
            assert sent.result().chunks == -(-x.nbytes // chunk)
    finally:
        jumbo.close()
        plain.close()
