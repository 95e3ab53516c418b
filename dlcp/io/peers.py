"""How endpoints find each other: a peer's address, and the key-value store
(e.g. torch.distributed's TCPStore) where each rank publishes its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..errors import ConfigError

__all__ = ["PeerAddress", "Store", "store_key"]


class Store(Protocol):
    """What DLCP needs of a key-value store (torch.distributed.TCPStore fits)."""

    def set(self, key: str, value: str | bytes) -> None: ...

    def get(self, key: str) -> bytes: ...


@dataclass(frozen=True, slots=True)
class PeerAddress:
    host: str
    data_port: int
    control_port: int

    def encode(self) -> str:
        return f"{self.host} {self.data_port} {self.control_port}"

    @classmethod
    def decode(cls, raw: str | bytes) -> PeerAddress:
        text = raw.decode() if isinstance(raw, bytes) else raw
        try:
            host, data, ctrl = text.split()
            return cls(host, int(data), int(ctrl))
        except ValueError:
            raise ConfigError(f"malformed peer address {text!r} in the store") from None


def store_key(job: int, rank: int) -> str:
    """The store key under which rank ``rank`` of job ``job`` publishes its address."""
    return f"dlcp/{job}/addr/{rank}"
