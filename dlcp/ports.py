"""A free TCP port for a job's store (``dlcp launch``'s ``MASTER_PORT``), picked
where no connection opened meanwhile can take it before rank 0 binds it."""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

__all__ = ["free_port"]

#: where the kernel says its ephemeral ports are (the first one)
_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: ports tried below the ephemeral range (at most), and how many of them
_BELOW_EPHEMERAL = 16384
_TRIES = 64


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now.

    Rank 0 binds it only later (its store starts after the ranks do), and until
    then anything may take it. The kernel's own pick for a bind to port 0 comes
    from its ephemeral range, where every connection any process opens also
    takes its local port: such a port was taken by a test's connection in the
    meantime now and then. So the port is picked at random from the
    ``_BELOW_EPHEMERAL`` ports below that range (which only a program binding
    that very port can take), checked by binding it; the kernel's pick only if
    none of ``_TRIES`` of them is free."""
    for port in _port_candidates(_ephemeral_start()):
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    """Whether TCP ``port`` can be bound on ``host`` and on every address (a store
    listens on all of them: a service on another address, or on IPv6, holding
    the port would make its bind fail)."""
    for family, address in ((socket.AF_INET, host), (socket.AF_INET, "0.0.0.0"),
                            (socket.AF_INET6, "::")):  # fmt: skip
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 here: nothing can listen on it either
            continue
        with s:
            try:
                s.bind((address, port))
            except OSError as exc:  # in use (or not ours to bind)
                if family == socket.AF_INET6 and exc.errno == errno.EADDRNOTAVAIL:
                    continue  # IPv6 disabled on this host's interfaces
                return False
    return True


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default if unknown)."""
    try:
        return int(_PORT_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_candidates(ephemeral_start: int) -> list[int]:
    """Up to ``_TRIES`` random ports from those below ``ephemeral_start`` (above 1023)."""
    span = range(max(1024, ephemeral_start - _BELOW_EPHEMERAL), ephemeral_start)
    # (not the module's generator: a launcher that seeded it would give two
    # concurrent launches the same candidates in the same order)
    return random.SystemRandom().sample(span, min(_TRIES, len(span)))
