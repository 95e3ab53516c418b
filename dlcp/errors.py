"""The exceptions DLCP raises: one tree, rooted at :class:`DLCPError`.

Every exception class defined in ``dlcp``, ``shims``, ``bench`` and ``testbed``
descends from :class:`DLCPError` (``tests/tree/test_error_tree.py`` walks the
packages and checks it), so ``except DLCPError`` catches whatever the library
raises on purpose (``WireError`` is defined in :mod:`dlcp.proto.wire`,
``GeometryError`` in :mod:`dlcp.proto.reassembler`)::

    DLCPError
    ├── UsageError (also ValueError)       the caller asked for something not allowed
    │   ├── ConfigError                    ... in a setting: argument or DLCP_* variable
    │   ├── ArgumentTypeError (also TypeError)     ... an argument of the wrong type
    │   └── UsageStateError (also RuntimeError)    ... a call its object's state refuses
    ├── WireError (also ValueError)        a datagram breaks the wire format
    ├── GeometryError (also ValueError)    a packet disagrees with its message
    ├── ProtocolStateError (also RuntimeError)  an event a phase does not allow
    ├── TransferFailed                     a message could not be delivered
    │   └── PeerTimeout (also TimeoutError)
    ├── StartupTimeout (also TimeoutError)
    ├── EndpointClosed
    ├── DependencyMissing (also RuntimeError)  an optional dependency is not installed
    └── BenchError (also RuntimeError)     a benchmark run failed (bench/)

:class:`UsageError` is API misuse: a wrong argument, a call out of order, a value
out of range. :class:`ConfigError` is the kind of misuse that a setting causes,
and derives from it, so ``except UsageError`` covers both; its messages name the
setting as the user wrote it (``DLCP_EMULATED_LOSS=2 outside [0, 1)``, or the
keyword argument). Both stay ``ValueError``\\ s, so code written against
``ValueError`` keeps working; the two other kinds of misuse keep the builtin
their callers knew as well (``TypeError``, ``RuntimeError``). Every message
names the rank, peer and message where there is one.
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "BenchError",
    "ConfigError",
    "DLCPError",
    "DependencyMissing",
    "EndpointClosed",
    "PeerTimeout",
    "ProtocolStateError",
    "StartupTimeout",
    "TransferFailed",
    "UsageError",
    "UsageStateError",
]


class DLCPError(Exception):
    """Base class of every exception DLCP raises."""


class UsageError(DLCPError, ValueError):
    """The caller asked for something DLCP does not allow (an argument, a value,
    a call in the wrong state); the message names what, as the caller wrote it."""


class ConfigError(UsageError):
    """A configuration value (argument or ``DLCP_*`` variable) is not allowed."""


class ArgumentTypeError(UsageError, TypeError):
    """An argument of a type DLCP does not take (a ``TypeError`` too)."""


class UsageStateError(UsageError, RuntimeError):
    """A call the object's state does not allow now: after ``close()``, out of
    order, or from a thread where waiting would deadlock (a ``RuntimeError`` too)."""


class DependencyMissing(DLCPError, RuntimeError):
    """An optional dependency the feature needs is not installed (the message
    says which extra brings it)."""


class ProtocolStateError(DLCPError, RuntimeError):
    """A protocol state machine was handed an event its current phase does not
    allow (a bug of its caller, not of the peer: peers' datagrams are checked
    and counted, never raised)."""


class TransferFailed(DLCPError):
    """A message could not be delivered within its loss bound."""


class PeerTimeout(TransferFailed, TimeoutError):
    """A peer stopped answering, or a message did not arrive in time."""


class StartupTimeout(DLCPError, TimeoutError):
    """The job's ranks did not all start within the start-up wait (how many the
    job expects comes from ``WORLD_SIZE``)."""


class EndpointClosed(DLCPError):
    """The endpoint was closed while the operation was pending."""


class BenchError(DLCPError, RuntimeError):
    """A benchmark run failed (its job reported an error, or its result is not
    usable); the message carries what the job said."""
