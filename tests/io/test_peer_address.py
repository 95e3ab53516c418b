"""A peer's address as the store holds it: what is not one is a ConfigError that
quotes it, whatever its bytes (a value that is not UTF-8 too)."""

from __future__ import annotations

import pytest

from dlcp.errors import ConfigError
from dlcp.io.peers import PeerAddress


def test_an_address_round_trips_through_the_store() -> None:
    addr = PeerAddress("10.0.0.7", 29500, 29501)
    assert PeerAddress.decode(addr.encode().encode()) == addr


@pytest.mark.parametrize(
    "raw", [b"10.0.0.7 29500", b"10.0.0.7 29500 0", b"\xff\xfe 1 2", "host 1 2", b""]
)
def test_what_is_not_an_address_is_named(raw: str | bytes) -> None:
    with pytest.raises(ConfigError, match=r"malformed peer address .* in the store"):
        PeerAddress.decode(raw)
