"""DLCP's benchmarks (docs/benchmarks.md): ``dlcp bench NAME`` or ``python -m dlcp.bench.NAME``."""

from __future__ import annotations

__all__ = ["Addresses"]


class Addresses(dict[str, bytes]):
    """The rendezvous store of endpoints in one process (each publishes before any
    looks another up), or of one whose peer's address is set in it first."""

    def set(self, key: str, value: str | bytes) -> None:
        self[key] = value.encode() if isinstance(value, str) else value

    def get(self, key: str) -> bytes:  # type: ignore[override]
        return self[key]
