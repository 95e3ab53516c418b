"""DLCP: a loss-tolerant, priority-aware gradient transport for distributed training.

``dlcp.proto`` is the sans-I/O protocol core; the I/O driver, collectives, shims
and testbed build on it.
"""

from .proto import FillPolicy, LossReport, ProtocolConfig, Session, TosMap, WireError

__version__ = "0.1.0"


def _register_torch_backend() -> None:
    # torch.distributed backend "dlcp" (shims.process_group), registered once torch
    # is loaded: this never imports torch (see shims.register_when_torch_loads)
    import importlib

    importlib.import_module("shims").register_when_torch_loads()


_register_torch_backend()

#: names from the I/O layer, imported on first use: ``import dlcp`` (and the
#: protocol core with it) stays free of sockets and threads
_LAZY = {
    "Endpoint": "dlcp.io",
    "EndpointConfig": "dlcp.io",
    "Communicator": "dlcp.collectives",
    "ConfigError": "dlcp.errors",
    "PeerTimeout": "dlcp.errors",
    "TransferFailed": "dlcp.errors",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dlcp' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "Communicator",
    "ConfigError",
    "Endpoint",
    "EndpointConfig",
    "FillPolicy",
    "LossReport",
    "PeerTimeout",
    "ProtocolConfig",
    "Session",
    "TosMap",
    "TransferFailed",
    "WireError",
]
