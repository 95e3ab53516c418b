"""Rendezvous through the store: every endpoint of a group agrees on its job id
and key with its peers, also when a job makes a second one (a second DDP hook,
a hook made again) and a rank gets to the store before rank 0."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from dlcp import rendezvous
from dlcp.errors import ConfigError
from tests.io.endpoint_helpers import LocalStore

SECRET = "5e" * 32


def _env(rank: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1", "DLCP_TIMEOUT": "5", "DLCP_JOB_SECRET": SECRET}  # fmt: skip


def test_a_second_endpoint_of_a_group_agrees_on_new_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore()
    monkeypatch.setattr(rendezvous, "_default_store", lambda job, timeout, env: store)
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
                # the same run nonce, so the same keys
                assert pair[0]._session.key.run_nonce == pair[1]._session.key.run_nonce
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


def test_a_small_group_of_a_job_on_several_hosts_refuses_loopback_too() -> None:
    """A process subgroup passes its own size as WORLD_SIZE: two ranks of a job
    of two hosts with two ranks each passed the check (2 is not more than
    LOCAL_WORLD_SIZE) and published 127.0.0.1 to a peer on the other host."""
    group_env = {**_env(0), "LOCAL_WORLD_SIZE": "2"}  # WORLD_SIZE 2: the group's
    with pytest.raises(ConfigError, match="other hosts"):
        rendezvous.connect(group="sub", store=LocalStore(), env=group_env, job_world_size=4)
    endpoint, _ = rendezvous.connect(group="sub", store=LocalStore(), env=group_env,
                                     job_world_size=2)  # one host: loopback is fine
    endpoint.close()


def test_env_job_names_a_bad_local_rank() -> None:
    with pytest.raises(ConfigError, match="LOCAL_RANK='abc' is not a non-negative integer"):
        rendezvous.env_job({**_env(0), "LOCAL_RANK": "abc"})


def test_a_rank_that_retries_connect_finds_its_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connect() that fails on one rank (its port taken, say) and is tried again
    uses the same namespace as its peers', and rank 0's values do not change."""
    store = LocalStore()
    monkeypatch.setattr(rendezvous, "_default_store", lambda job, timeout, env: store)
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


def test_each_group_in_a_store_of_its_own_gets_its_own_job_id_and_nonce() -> None:
    # the process-group backend connects every group (a new_group, a group made
    # again) under the same prefix of a store of the group's own
    single = {**_env(0), "WORLD_SIZE": "1"}
    stores = [LocalStore(), LocalStore()]
    made = [rendezvous.connect(group="pg", store=s, authenticate=True, env=single)
            for s in stores]  # fmt: skip
    try:
        (a, _), (b, _) = made
        assert a.job != b.job
        assert stores[0].get("pg/nonce") != stores[1].get("pg/nonce")
    finally:
        for endpoint, _ in made:
            endpoint.close()


def test_a_torchrun_restart_does_not_read_the_last_attempts_keys() -> None:
    """Under torchrun's agent the store outlives a restart (``--max-restarts``): a
    restarted rank 1 that got there before rank 0 took the previous attempt's job
    id, and every transfer of the new attempt timed out. Each attempt now has
    keys of its own, and every rank is the agent store's client (rank 0 tried to
    serve on the agent's port)."""
    from datetime import timedelta

    import numpy as np
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    agent = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10))

    def env(rank: int, restart: int) -> dict[str, str]:
        return {**_env(rank), "MASTER_PORT": str(agent.port), "DLCP_TIMEOUT": "10",
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RESTART_COUNT": str(restart)}  # fmt: skip

    endpoints: list[Any] = []
    try:
        with ThreadPoolExecutor(2) as pool:
            first = [pool.submit(rendezvous.connect, group="restart", env=env(r, 0))
                     for r in (0, 1)]  # fmt: skip
            endpoints += [f.result(timeout=30)[0] for f in first]
            for e in endpoints:  # (the first attempt's ranks are gone)
                e.close()
            rendezvous._calls.clear()  # new processes: the call numbers start again
            one = pool.submit(rendezvous.connect, group="restart", env=env(1, 1))
            # waits for the new attempt's rank 0 (it returned at once with the old id)
            with pytest.raises(TimeoutError):
                one.result(timeout=1.0)
            zero = pool.submit(rendezvous.connect, group="restart", env=env(0, 1))
            second = [zero.result(timeout=30)[0], one.result(timeout=30)[0]]
            endpoints += second
        assert second[0].job == second[1].job
        got = second[1].recv(src=0, msg=1, out=np.empty(100, np.float32))
        second[0].send(np.arange(100, dtype=np.float32), to=1, msg=1).result(timeout=10)
        assert np.array_equal(got.result(timeout=10).data, np.arange(100, dtype=np.float32))
    finally:
        for e in endpoints:
            e.close()


def test_a_bad_restart_count_is_named() -> None:
    with pytest.raises(ConfigError, match="TORCHELASTIC_RESTART_COUNT='x'"):
        rendezvous.attempt({"TORCHELASTIC_RESTART_COUNT": "x"})


def test_an_ipv6_master_and_a_port_out_of_range_are_named() -> None:
    with pytest.raises(ConfigError, match="MASTER_ADDR='::1' is an IPv6 address: DLCP runs over"):
        rendezvous.local_address("::1")
    with pytest.raises(ConfigError, match=r"MASTER_PORT=99999 is not a port \(1\.\.65535\)"):
        rendezvous.env_job({**_env(0), "MASTER_PORT": "99999"})


def test_a_prefixed_store_view_checks_and_waits_under_its_prefix() -> None:
    """The endpoint's I/O thread asks check() (never waits) and its callers
    wait() for a peer's address: a view under a prefix must pass both on."""
    import datetime

    from torch.distributed import HashStore  # type: ignore[attr-defined]

    from dlcp.rendezvous import _Prefixed

    base = HashStore()
    view = _Prefixed(base, "view/")
    assert not view.check(["k"])
    base.set("view/k", b"v")
    assert view.check(["k"]) and view.get("k") == b"v"
    view.wait(["k"], datetime.timedelta(seconds=1))


def test_connect_twice_without_a_process_group_shares_the_jobs_store() -> None:
    """Without torch.distributed initialised each connect() made a TCPStore of
    its own, and rank 0's second could not serve on MASTER_PORT (address in use)."""
    from dlcp.launch import free_port

    env = {**_env(0), "WORLD_SIZE": "1", "MASTER_PORT": str(free_port())}
    first, _ = rendezvous.connect(group="twice", env=env)
    try:
        second, _ = rendezvous.connect(group="twice", env=env)
        second.close()
    finally:
        first.close()
    assert first.job != second.job  # a namespace of its own (the call number)


_CONNECT_THEN_INIT = """
import os, sys
import torch, torch.distributed as dist
from dlcp.rendezvous import connect
endpoint, job = connect()
dist.init_process_group("gloo")  # env:// on the same MASTER_PORT
t = torch.ones(3)
dist.all_reduce(t)
# one server behind both: what DLCP's rendezvous wrote, torch's store reads
assert dist.distributed_c10d._get_default_store().num_keys() > 0
endpoint.close()
dist.destroy_process_group()
print("trained on", t.tolist())
"""


def test_init_process_group_after_connect_shares_master_port() -> None:
    """connect() without a process group serves the job's store on MASTER_PORT;
    rank 0's later ``init_process_group`` (env://) failed there with
    EADDRINUSE. DLCP's store is now multi-tenant, as torch's own is, so both
    share one server."""
    import os
    import subprocess
    import sys

    from dlcp.launch import free_port

    env = {**os.environ, **_env(0), "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_PORT": str(free_port())}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", _CONNECT_THEN_INIT], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "trained on [1.0, 1.0, 1.0]" in run.stdout


def test_a_rank_waiting_for_a_rank_0_that_never_comes_says_so_and_gives_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With fewer ranks started than WORLD_SIZE, rank 0 never gets past torch's store
    to publish the job, and rank 1 waited for it without a word. It now says what
    it waits for after DLCP_TIMEOUT and gives up at the store's own timeout (the
    process group's, init_process_group's ``timeout``) with StartupTimeout."""
    import time
    from datetime import timedelta

    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    from dlcp.errors import StartupTimeout

    store = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=2))
    env = {**_env(1), "WORLD_SIZE": "3", "MASTER_PORT": str(store.port), "DLCP_TIMEOUT": "0.5"}
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="dlcp.rendezvous"), pytest.raises(StartupTimeout) as err:
        rendezvous.connect(group="never", store=store, env=env)
    took = time.monotonic() - started
    assert 1.8 < took < 10, took
    said = str(err.value)
    assert said.startswith("rank 1: rank 0 did not start the job within 2 s.")
    assert (
        "WORLD_SIZE=3: 3 ranks must start, each with its own RANK, MASTER_ADDR=127.0.0.1 "
        f"and MASTER_PORT={store.port}"
    ) in said
    (notice,) = [r.getMessage() for r in caplog.records]
    assert notice.startswith("dlcp rank 1: still waiting for rank 0 after 0.5 s (WORLD_SIZE=3")
    assert notice.endswith("giving up after 2 s")


def test_rank_0_of_a_job_without_its_other_ranks_says_what_it_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a process group DLCP serves the job's store itself; rank 0 waits
    there (DLCP_TIMEOUT) for WORLD_SIZE ranks, and says so when they do not come."""
    from dlcp.errors import StartupTimeout
    from dlcp.launch import free_port

    monkeypatch.setattr(rendezvous, "_stores", {})
    env = {**_env(0), "WORLD_SIZE": "3", "MASTER_PORT": str(free_port()), "DLCP_TIMEOUT": "1"}
    with pytest.raises(StartupTimeout) as err:
        rendezvous.connect(group="alone", env=env)
    said = str(err.value)
    assert said.startswith("rank 0: Timed out after")
    assert "1/3 clients joined" in said and "WORLD_SIZE=3: 3 ranks must start" in said


@pytest.mark.parametrize(
    ("extra", "drop_secret", "argument", "want"),
    [
        ({}, False, None, False),  # a secret alone does not turn it on (not cheap enough)
        ({"DLCP_AUTHENTICATE": "1"}, False, None, True),
        ({}, False, True, True),
        ({"DLCP_AUTHENTICATE": "1"}, False, False, False),  # the argument wins
        ({}, True, None, False),
    ],
    ids=["secret", "env-on", "argument-on", "argument-off", "no-secret"],
)
def test_an_endpoint_authenticates_when_asked(
    extra: dict[str, str], drop_secret: bool, argument: bool | None, want: bool
) -> None:
    env = {**_env(0), "WORLD_SIZE": "1", **extra}
    if drop_secret:
        del env["DLCP_JOB_SECRET"]
    endpoint, _ = rendezvous.connect(group="auth", store=LocalStore(), env=env,
                                     authenticate=argument)  # fmt: skip
    try:
        assert endpoint.config.protocol.authenticate is want
    finally:
        endpoint.close()
