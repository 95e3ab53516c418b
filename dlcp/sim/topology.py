"""The simulated fabric as a testbed topology description.

The simulation reads the same leaf-spine description as the namespace testbed
(:class:`testbed.topology.Topology`, TOML or built here): hosts, the leaf
each hangs off, spines; every leaf links to every spine. :func:`leaf_spine`
builds the regular one a :class:`SimConfig` asks for (``h1..hN`` on
``leaf1..leafL``, ``spine1..spineS``); :func:`host_leaf_indices` is what the
ns-3 builder needs from any description.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .config import SimConfig, SimConfigError

if TYPE_CHECKING:
    from testbed.topology import Topology

__all__ = ["host_leaf_indices", "leaf_spine", "load_topology"]

# The description's format is the testbed's (testbed.topology): it is imported in the
# functions that build or read one, so that importing dlcp.sim does not import the testbed.


def leaf_spine(cfg: SimConfig) -> Topology:
    """The regular leaf-spine of ``cfg`` as a testbed ``Topology``."""
    leaves = [f"leaf{i + 1}" for i in range(cfg.leaves)]
    hosts = {f"h{h + 1}": {"leaf": leaves[h // cfg.hosts_per_leaf]} for h in range(cfg.hosts)}
    from testbed.topology import Topology

    return Topology.from_dict(
        {
            "name": f"leaf_spine_{cfg.hosts}h",
            "mtu": cfg.protocol_config().mtu,
            "link_rate_mbit": cfg.link_gbps * 1000,
            "buffer_packets": cfg.buffer_packets,
            "leaves": leaves,
            "spines": [f"spine{i + 1}" for i in range(cfg.spines)],
            "hosts": hosts,
        }
    )


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """A testbed TOML topology file (raises TopologyError naming the bad field)."""
    from testbed.topology import Topology

    return Topology.load(path)


def host_leaf_indices(topology: Topology) -> tuple[list[int], int, int]:
    """(leaf index of every host in file order, number of leaves, number of spines)."""
    index = {name: i for i, name in enumerate(topology.leaves)}
    leaf_of = [index[h.leaf] for h in topology.hosts]
    if len(topology.spines) < 1:
        raise SimConfigError(f"topology {topology.name}: a leaf-spine needs at least one spine")
    return leaf_of, len(topology.leaves), len(topology.spines)
