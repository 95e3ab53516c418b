"""DLCP: a loss-tolerant, priority-aware gradient transport for distributed training.

``dlcp.proto`` is the sans-I/O protocol core; the I/O driver, collectives, shims
and testbed build on it.
"""

from .proto import FillPolicy, LossReport, ProtocolConfig, Session, TosMap, WireError

__version__ = "0.1.0"


def _register_torch_backend() -> None:
    # torch.distributed backend "dlcp" (dlcp.shims.process_group), registered once torch
    # is loaded: this never imports torch (see dlcp.shims.register_when_torch_loads)
    import importlib

    importlib.import_module("dlcp.shims").register_when_torch_loads()


_register_torch_backend()

__all__ = ["FillPolicy", "LossReport", "ProtocolConfig", "Session", "TosMap", "WireError"]
