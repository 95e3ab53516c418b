"""The port `dlcp launch` gives a job's store: free, and outside the kernel's
ephemeral range, where any connection opened meanwhile could take it."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest

from dlcp import ports
from dlcp.ports import free_port


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    start = ports._ephemeral_start()
    if not ports._port_candidates(start):
        pytest.skip(f"the ephemeral range starts at {start}: no unprivileged port below it")
    for _ in range(20):
        port = free_port()
        assert max(1024, start - ports._BELOW_EPHEMERAL) <= port < start
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", port))  # free on every address: it binds


@contextlib.contextmanager
def _taken_and_free(address: str) -> Iterator[tuple[int, int]]:
    """A port held (listening) on ``address``, and one that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind((address, 0))
        busy.listen()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
            free = probe.getsockname()[1]
        yield busy.getsockname()[1], free


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0"])
def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    # a store binds every address: a port some service holds on the wildcard
    # address is taken for it too, though 127.0.0.1 alone would seem free
    with _taken_and_free(address) as (taken, other):
        assert not ports._bindable("127.0.0.1", taken)
        monkeypatch.setattr(ports, "_port_candidates", lambda start: [taken, other])
        assert free_port() == other


def test_with_no_candidate_free_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(ports, "_port_candidates", lambda start: [taken] * 3)
        port = free_port()
        assert port != taken and port > 0


def test_candidates_stay_above_the_privileged_ports() -> None:
    assert all(1024 <= p < 2000 for p in ports._port_candidates(2000))
    assert ports._port_candidates(1024) == []
    assert len(set(ports._port_candidates(40000))) == ports._TRIES
