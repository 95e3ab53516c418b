"""DLCP: a loss-tolerant, priority-aware gradient transport for distributed training.

``dlcp.proto`` is the sans-I/O protocol core; the I/O driver, collectives, shims
and testbed build on it.
"""

from .proto import FillPolicy, LossReport, ProtocolConfig, Session, TosMap, WireError

__version__ = "0.1.0"

__all__ = ["FillPolicy", "LossReport", "ProtocolConfig", "Session", "TosMap", "WireError"]
