"""Rendezvous through the store: every endpoint of a group agrees on its job id
and key with its peers, also when a job makes a second one (a second DDP hook,
a hook made again) and a rank gets to the store before rank 0."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from dlcp import rendezvous
from dlcp.errors import ConfigError
from tests.integration.endpoint_helpers import LocalStore


def _env(rank: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1", "DLCP_TIMEOUT": "5"}  # fmt: skip


def test_a_second_endpoint_of_a_group_agrees_on_new_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore()
    monkeypatch.setattr(rendezvous, "_default_store", lambda job, timeout: store)
    monkeypatch.setattr(rendezvous, "_calls", {})
    group = "hook-test"
    endpoints: list[Any] = []
    try:
        with ThreadPoolExecutor(2) as pool:
            for _ in range(2):
                # rank 1 first: with one namespace per group it read the job id and
                # key the previous endpoint had left there, before rank 0 replaced them
                one = pool.submit(rendezvous.connect, group=group, authenticate=True,
                                  env=_env(1))  # fmt: skip
                zero = pool.submit(rendezvous.connect, group=group, authenticate=True,
                                   env=_env(0))  # fmt: skip
                pair = [zero.result(timeout=20)[0], one.result(timeout=20)[0]]
                endpoints += pair
                assert pair[0].job == pair[1].job, [e.job for e in pair]
                assert pair[0]._session.key == pair[1]._session.key  # the same agreed key
        assert {store.get(f"{group}/0/job"), store.get(f"{group}/1/job")} == {
            str(e.job).encode() for e in endpoints
        }
        # and they talk: a message from the second rank 0 to the second rank 1
        a, b = endpoints[2], endpoints[3]
        import numpy as np

        got = b.recv(src=0, msg=1, out=np.empty(100, np.float32))
        a.send(np.arange(100, dtype=np.float32), to=1, msg=1).result(timeout=10)
        assert np.array_equal(got.result(timeout=10).data, np.arange(100, dtype=np.float32))
    finally:
        for e in endpoints:
            e.close()


def test_env_job_names_a_bad_variable() -> None:
    with pytest.raises(ConfigError, match="RANK='x' is not an integer"):
        rendezvous.env_job({**_env(0), "RANK": "x"})


def test_loopback_master_of_a_job_on_several_hosts_is_refused() -> None:
    # Debian maps the host name to 127.0.1.1: ranks elsewhere cannot reach loopback
    assert rendezvous.local_address("127.0.1.1") == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"127\.0\.1\.1.* other hosts .* set DLCP_HOST"):
        rendezvous.local_address("127.0.1.1", hosts_beyond=True)


def test_env_job_names_a_bad_local_rank() -> None:
    with pytest.raises(ConfigError, match="LOCAL_RANK='abc' is not a non-negative integer"):
        rendezvous.env_job({**_env(0), "LOCAL_RANK": "abc"})


def test_a_rank_that_retries_connect_finds_its_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connect() that fails on one rank (its port taken, say) and is tried again
    uses the same namespace as its peers', and rank 0's values do not change."""
    store = LocalStore()
    monkeypatch.setattr(rendezvous, "_default_store", lambda job, timeout: store)
    monkeypatch.setattr(rendezvous, "_calls", {})
    monkeypatch.setattr(rendezvous, "_chosen", {})
    real = rendezvous.Endpoint
    failures = iter([OSError(98, "Address already in use")])

    def flaky(rank: int, **kw: Any) -> Any:
        if rank == 1 and (exc := next(failures, None)) is not None:
            raise exc
        return real(rank, **kw)

    monkeypatch.setattr(rendezvous, "Endpoint", flaky)
    endpoints: list[Any] = []
    try:
        with ThreadPoolExecutor(2) as pool:
            zero = pool.submit(rendezvous.connect, group="retry", env=_env(0))
            with pytest.raises(OSError, match="Address already in use"):
                rendezvous.connect(group="retry", env=_env(1))
            one = pool.submit(rendezvous.connect, group="retry", env=_env(1))
            endpoints = [zero.result(timeout=20)[0], one.result(timeout=20)[0]]
        assert endpoints[0].job == endpoints[1].job
        assert rendezvous._calls == {("retry", 0): 1, ("retry", 1): 1}
    finally:
        for e in endpoints:
            e.close()
