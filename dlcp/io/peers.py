"""How endpoints find each other: a peer's address, and the key-value store
(e.g. torch.distributed's TCPStore) where each rank publishes its own."""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from ..errors import ConfigError, PeerTimeout, UsageError

__all__ = ["PeerAddress", "PeerBook", "Store", "store_key"]


class Store(Protocol):
    """What DLCP needs of a key-value store (torch.distributed.TCPStore fits)."""

    def set(self, key: str, value: str | bytes) -> None: ...

    def get(self, key: str) -> bytes: ...


@dataclass(frozen=True, slots=True)
class PeerAddress:
    """Where a rank is reached: an IPv4 address (a literal: the data path sends
    to it as is) and its two ports."""

    host: str
    data_port: int
    control_port: int

    def __post_init__(self) -> None:
        try:
            ip = ipaddress.IPv4Address(self.host)
        except ValueError:
            raise ConfigError(f"peer address {self.host!r} is not an IPv4 address") from None
        if ip.is_unspecified:
            raise ConfigError(f"peer address {self.host!r} is the wildcard, not a peer")
        for name in ("data_port", "control_port"):
            port = getattr(self, name)
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535:
                raise ConfigError(f"peer {name} {port!r} is not a port (1..65535)")

    def encode(self) -> str:
        return f"{self.host} {self.data_port} {self.control_port}"

    @classmethod
    def decode(cls, raw: str | bytes) -> PeerAddress:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        try:
            host, data, ctrl = text.split()
            return cls(host, int(data), int(ctrl))
        except (ValueError, ConfigError):
            raise ConfigError(f"malformed peer address {text!r} in the store") from None


def _given(rank: int, host: str, data_port: int, control_port: int) -> PeerAddress:
    """A peer address given by the caller: a host name is resolved once, here
    (to its first IPv4 address), so that a name cannot fail later, mid-transfer."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        try:
            host = str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
        except (OSError, UnicodeError) as exc:
            raise ConfigError(f"rank {rank}: cannot resolve host {host!r}: {exc}") from None
    try:
        return PeerAddress(host, data_port, control_port)
    except ConfigError as exc:
        raise ConfigError(f"rank {rank}: {exc}") from None


def store_key(job: int, rank: int) -> str:
    """The store key under which rank ``rank`` of job ``job`` publishes its address."""
    return f"dlcp/{job}/addr/{rank}"


class PeerBook:
    """The addresses of one rank's peers: the ones given at creation, the rest
    looked up in ``store`` the first time they are needed (and kept)."""

    def __init__(
        self,
        rank: int,
        job: int,
        peers: Mapping[int, PeerAddress | tuple[str, int, int]] | None,
        store: Store | None,
    ) -> None:
        self.rank, self.job, self.store = rank, job, store
        self.addresses: dict[int, PeerAddress] = {
            r: a if isinstance(a, PeerAddress) else _given(r, *a) for r, a in (peers or {}).items()
        }

    def publish(self, address: PeerAddress) -> None:
        """This rank's own address: known here, and in the store for the others."""
        self.addresses.setdefault(self.rank, address)
        if self.store is not None:
            self.store.set(store_key(self.job, self.rank), address.encode())

    def known(self, peer: int) -> PeerAddress | None:
        """``peer``'s address if it can be had without waiting: known here, or
        published in the store already (None if not: a rank that sent something
        but never published an address is not one of the job's). For the I/O
        thread, which must not wait on the store."""
        addr = self.addresses.get(peer)
        if addr is not None or self.store is None or peer == self.rank:
            return addr
        key = store_key(self.job, peer)
        check = getattr(self.store, "check", None)
        if callable(check) and not check([key]):
            return None
        return self.resolve(peer)

    def resolve(self, peer: int, *, timeout: float | None = None) -> PeerAddress:
        """``peer``'s address; ValueError if it is this rank or has none.

        A peer looked up in the store is waited for at most ``timeout`` seconds
        when the store can wait on a key (torch's stores can; their own timeout,
        often minutes, applies otherwise), then PeerTimeout."""
        if peer == self.rank:
            raise UsageError(f"rank {peer} cannot send to or receive from itself")
        addr = self.addresses.get(peer)
        if addr is not None:
            return addr
        if self.store is None:
            raise UsageError(
                f"rank {peer} is not a peer of rank {self.rank} (known: {sorted(self.addresses)})"
            )
        key = store_key(self.job, peer)
        wait = getattr(self.store, "wait", None)
        if timeout is not None and callable(wait):
            started = time.monotonic()
            try:
                wait([key], timedelta(seconds=timeout))
            except Exception:  # torch raises DistStoreError on timeout
                if time.monotonic() - started < 0.9 * timeout:
                    raise  # the store failed, it did not time out
                raise PeerTimeout(
                    f"rank {peer} did not publish its address (store key {key!r}) "
                    f"within {timeout:g} s"
                ) from None
        addr = PeerAddress.decode(self.store.get(key))
        self.addresses[peer] = addr
        return addr
