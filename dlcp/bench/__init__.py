"""DLCP's benchmarks (docs/benchmarks.md): ``dlcp bench NAME`` or ``python -m dlcp.bench.NAME``."""

from __future__ import annotations

import argparse

__all__ = ["Addresses", "positive_counts"]


def positive_counts(text: str) -> list[int]:
    """An argparse ``type``: comma-separated positive integers (``"1,16,1024"``)."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive whole numbers, comma-separated")
    return counts


class Addresses(dict[str, bytes]):
    """The rendezvous store of endpoints in one process (each publishes before any
    looks another up), or of one whose peer's address is set in it first."""

    def set(self, key: str, value: str | bytes) -> None:
        self[key] = value.encode() if isinstance(value, str) else value

    def get(self, key: str) -> bytes:  # type: ignore[override]
        return self[key]
