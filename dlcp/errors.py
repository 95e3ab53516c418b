"""Exceptions users of DLCP catch. Every message names the rank, peer and message."""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DLCPError",
    "EndpointClosed",
    "PeerTimeout",
    "StartupTimeout",
    "TransferFailed",
]


class DLCPError(Exception):
    """Base class of DLCP's run-time errors."""


class ConfigError(DLCPError, ValueError):
    """A configuration value (argument or ``DLCP_*`` variable) is not allowed."""


class TransferFailed(DLCPError):
    """A message could not be delivered within its loss bound."""


class PeerTimeout(TransferFailed, TimeoutError):
    """A peer stopped answering, or a message did not arrive in time."""


class StartupTimeout(DLCPError, TimeoutError):
    """The job's ranks did not all start within the start-up wait (how many the
    job expects comes from ``WORLD_SIZE``)."""


class EndpointClosed(DLCPError):
    """The endpoint was closed while the operation was pending."""
