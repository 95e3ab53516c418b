"""DLCP: a loss-tolerant, priority-aware gradient transport for distributed training.

``dlcp.proto`` is the sans-I/O protocol core; the I/O driver, collectives, shims
and testbed build on it.
"""

from .proto import FillPolicy, LossReport, ProtocolConfig, Session, TosMap, WireError

__version__ = "0.1.0"


def _register_torch_backend() -> None:
    # The torch.distributed backend "dlcp" lives in the package shims (whose modules import
    # dlcp, hence the import here, not at the top). Registered now if torch is loaded;
    # otherwise torch's plugin hook (the torch.backends entry point) registers it when
    # torch loads, and only with that hook switched off does this import torch: see
    # shims.register_for_import_of_dlcp and docs/usage.md.
    from shims import register_for_import_of_dlcp

    register_for_import_of_dlcp()


_register_torch_backend()


def __getattr__(name: str) -> object:
    """Names from the I/O layer, imported on first use: ``import dlcp`` (and the
    protocol core with it) stays free of sockets and threads."""
    if name in ("Endpoint", "EndpointConfig"):
        from . import io

        return getattr(io, name)
    if name == "Communicator":
        from .collectives import Communicator

        return Communicator
    if name in ("ConfigError", "PeerTimeout", "TransferFailed"):
        from . import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'dlcp' has no attribute {name!r}")


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
