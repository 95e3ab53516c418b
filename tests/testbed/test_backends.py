"""The testbed backends behind one interface (testbed/backend.py): which backend a
run gets, that each implements the interface, that the experiment is written
against the interface only, and (root) one namespace testbed driven through it."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import textwrap

import pytest

from testbed import experiments as ex
from testbed.backend import NamespacesBackend, TestbedBackend, backend_class
from testbed.bmv2_backend import Bmv2Backend
from testbed.experiment_config import SWITCHES
from testbed.mininet_backend import MininetBackend, mininet_missing
from testbed.netns import missing_tools
from testbed.switch_profile import FifoPolicy, SwitchPolicy
from testbed.topology import Topology

BACKENDS = (NamespacesBackend, MininetBackend, Bmv2Backend)


@pytest.mark.parametrize(
    ("switch", "network", "expected"),
    [
        ("linux", "namespaces", NamespacesBackend),
        ("linux", "mininet", MininetBackend),
        ("bmv2", "namespaces", Bmv2Backend),
    ],
)
def test_a_run_gets_the_backend_of_its_switch_and_network(
    switch: str, network: str, expected: type[TestbedBackend]
) -> None:
    assert backend_class(switch, network) is expected
    config = ex.ExperimentConfig("clean", "dlcp", switch=switch, backend=network)
    assert type(ex.backend_for(config, Topology.default())) is expected


@pytest.mark.parametrize(
    ("switch", "network", "says"),
    [
        ("bmv2", "mininet", "--switch bmv2 runs in plain namespaces, not mininet"),
        ("tofino", "namespaces", "unknown switch 'tofino'"),
        ("linux", "docker", "unknown backend 'docker'"),
    ],
)
def test_a_combination_without_a_backend_is_refused(switch: str, network: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        backend_class(switch, network)
    with pytest.raises(ValueError, match=says.split(" (")[0]):
        ex.ExperimentConfig("clean", "dlcp", switch=switch, backend=network)


@pytest.mark.parametrize("kind", BACKENDS)
def test_every_backend_implements_the_whole_interface(kind: type[TestbedBackend]) -> None:
    assert not inspect.isabstract(kind), kind.__abstractmethods__
    backend = kind(Topology.default(), SwitchPolicy())
    assert backend.switch in SWITCHES
    with pytest.raises(RuntimeError, match="the network is not built"):
        backend.counters()


def test_bmv2_takes_its_queueing_from_a_dlcp_policy_only() -> None:
    with pytest.raises(ValueError, match="needs a SwitchPolicy, not FifoPolicy"):
        Bmv2Backend(Topology.default(), FifoPolicy())


def test_the_experiment_names_no_backend() -> None:
    """run_experiment and its helpers reach a network through the interface: no
    isinstance, no backend class or backend-specific function named."""
    source = textwrap.dedent(inspect.getsource(ex))
    tree = ast.parse(source)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    specific = {
        "isinstance", "Bmv2Network", "Bmv2Backend", "MininetBackend", "NamespacesBackend",
        "bmv2_counters", "bmv2_link_down", "bmv2_set_loss", "build_bmv2", "build_mininet",
        "link_loss", "link_down", "profile_counters", "apply_profile",
    }  # fmt: skip
    assert names & specific == set()


def test_a_mininet_run_says_so_in_its_name() -> None:
    config = ex.ExperimentConfig("loss", "gloo", backend="mininet")
    assert config.name == "loss-gloo-mininet" and config.profile == "fifo"


# --- root: one testbed built, impaired, counted and removed through the interface ---

MISSING = missing_tools(loss=True, offloads=True)


def _drive(backend: TestbedBackend) -> None:
    with backend.build() as net:
        names = list(net.namespaces)
        before = backend.counters()
        backend.inject_loss("leaf1", "spine1", 99.0)
        # h1 (leaf1) to h3 (leaf2): half the ECMP paths cross leaf1--spine1
        # (32 source ports: about half of them hash onto leaf1--spine1)
        script = (
            "import socket\n"
            "for sport in range(40000, 40032):\n"
            "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "    s.bind(('', sport))\n"
            f"    s.sendto(b'x' * 100, ('{net.host_addr('h3')}', 9))\n"
        )
        net.run("h1", ["python3", "-c", script])
        traffic = backend.traffic(before, backend.counters(), lossy_link=("leaf1", "spine1"))
        assert traffic.loss_drops is not None and traffic.loss_drops["leaf1->spine1"] > 0
        assert traffic.classes["loss-rule"]["drops"] == sum(traffic.loss_drops.values())
        assert "leaf1" in traffic.links
        backend.take_link_down("leaf1", "spine1")  # returns once h1 reaches h3 again
        net.run("h1", ["ping", "-c", "1", "-W", "2", net.host_addr("h3")])
    listed = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                check=True).stdout.split())  # fmt: skip
    assert not listed & set(names), "the backend left namespaces behind"


@pytest.mark.root
@pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (network namespaces)")
def test_a_namespace_testbed_through_the_interface() -> None:
    t = Topology.default()
    _drive(NamespacesBackend(t, ex.switch_policy(t, 200.0), prefix=f"dlcpbe{os.getpid() % 1000}-"))


@pytest.mark.root
@pytest.mark.skipif(bool(mininet_missing()), reason="needs Mininet (pip install 'dlcp[testbed]')")
def test_a_mininet_testbed_through_the_interface() -> None:
    t = Topology.default()
    _drive(MininetBackend(t, ex.switch_policy(t, 200.0), prefix=f"dlcpbm{os.getpid() % 1000}-"))


def test_a_backend_without_a_cli_says_so() -> None:
    with pytest.raises(ValueError, match="NamespacesBackend has no interactive CLI"):
        NamespacesBackend(Topology.default(), None).open_cli()


def test_the_run_log_describes_the_links_by_backend() -> None:
    t = Topology.default()
    assert NamespacesBackend(t, None).describe_links(200.0) == "links 200 Mbit/s, hosts shaped"
    unshaped = NamespacesBackend(t, None, host_egress="unshaped")
    assert unshaped.describe_links(200.0) == "links 200 Mbit/s, hosts unshaped"
    assert Bmv2Backend(t, SwitchPolicy()).describe_links(200.0) == (
        "BMv2 switches (P4Runtime), links not shaped"
    )
