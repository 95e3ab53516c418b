"""Large-scale packet-level simulation of DLCP, TCP and DCTCP on ns-3.

``pip install 'dlcp[sim]'`` brings ns-3 (PyPI ``ns3``, Python bindings through
cppyy). The model's per-packet logic is C++ in ``dlcp/sim/cpp`` compiled at run
time; each run happens in its own interpreter (:mod:`dlcp.sim.runner`). Entry
points: ``dlcp sim run`` / ``dlcp sim suite`` (:mod:`dlcp.sim.cli`), or
:func:`run_many` with :class:`SimConfig` objects.

Modules: :mod:`~dlcp.sim.config` (what a run is), :mod:`~dlcp.sim.models`
(layer tables), :mod:`~dlcp.sim.workloads` (PS and ring all-reduce as message
DAGs), :mod:`~dlcp.sim.topology` (leaf-spine description),
:mod:`~dlcp.sim.engine` (the ns-3 side), :mod:`~dlcp.sim.results` and
:mod:`~dlcp.sim.plots`.
"""

from .config import ABLATIONS, TRANSPORTS, WORKLOADS, SimConfig, SimConfigError
from .runner import SimError, ns3_available, run_many

__all__ = [
    "ABLATIONS",
    "TRANSPORTS",
    "WORKLOADS",
    "SimConfig",
    "SimConfigError",
    "SimError",
    "ns3_available",
    "run_many",
]
