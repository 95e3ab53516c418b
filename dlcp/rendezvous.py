"""Rendezvous through torch.distributed's TCPStore and the ``env://`` variables.

``torchrun`` (and ``dlcp launch``) set MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE and LOCAL_RANK. Rank 0 picks the job id and a fresh run nonce and
writes them to the store; every rank publishes its endpoint's address there,
and looks its peers up there when it first talks to them. No discovery
protocol of our own.

The store is not secret (it has no authentication and listens on every
interface): with authentication, every rank derives its keys from the job's
secret, which reaches it out of band (``DLCP_JOB_SECRET`` or
``DLCP_JOB_SECRET_FILE``; ``dlcp launch`` sets one), and the run nonce
(:mod:`dlcp.keyring`). No key is ever written to the store.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .errors import ConfigError, StartupTimeout
from .io.config import EndpointConfig
from .io.endpoint import Endpoint
from .io.peers import Store
from .keyring import SECRET_ENV, SECRET_FILE_ENV, KeyRing, job_secret, new_run_nonce
from .settings import config_from_env

__all__ = ["JobInfo", "attempt", "connect", "env_job", "local_address"]


@dataclass(frozen=True, slots=True)
class JobInfo:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def env_job(env: Mapping[str, str] | None = None) -> JobInfo:
    """The ``env://`` variables, checked, with an error that says what to do."""
    env = os.environ if env is None else env
    values: dict[str, int | str] = {}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        raw = env.get(name)
        if raw is None:
            raise ConfigError(
                f"{name} is not set: start the ranks with torchrun or "
                "`dlcp launch`, or set MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE"
            )
        if name == "MASTER_ADDR":
            values[name] = raw
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if not 1 <= int(values["MASTER_PORT"]) <= 65535:
        raise ConfigError(f"MASTER_PORT={values['MASTER_PORT']} is not a port (1..65535)")
    rank, world = int(values["RANK"]), int(values["WORLD_SIZE"])
    if not 0 <= rank < world:
        raise ConfigError(f"RANK={rank} outside 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
    local_rank = env.get("LOCAL_RANK", "0")
    if not local_rank.isdigit():
        raise ConfigError(f"LOCAL_RANK={local_rank!r} is not a non-negative integer")
    return JobInfo(
        rank,
        world,
        int(local_rank),
        str(values["MASTER_ADDR"]),
        int(values["MASTER_PORT"]),
    )


def local_address(master_addr: str, *, hosts_beyond: bool = False) -> str:
    """The address of this host on the route to the master (loopback stays
    loopback, unless ``hosts_beyond``: ranks on other hosts could not reach it)."""
    if ":" in master_addr:
        raise ConfigError(
            f"MASTER_ADDR={master_addr!r} is an IPv6 address: DLCP runs over IPv4; "
            "give an IPv4 address or a name that resolves to one"
        )
    try:
        target = socket.gethostbyname(master_addr)
    except OSError as exc:
        raise ConfigError(f"MASTER_ADDR={master_addr!r} does not resolve: {exc}") from None
    if target.startswith("127."):
        if hosts_beyond:
            raise ConfigError(
                f"MASTER_ADDR={master_addr!r} resolves to the loopback address {target}, "
                "but the job has ranks on other hosts (WORLD_SIZE > LOCAL_WORLD_SIZE): set "
                "DLCP_HOST to this host's address on the network the ranks share"
            )
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((target, 9))  # no packet is sent: this only picks the route
        return str(s.getsockname()[0])


def _default_store(job: JobInfo, timeout: float, env: Mapping[str, str]) -> Any:
    import torch.distributed as dist
    from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

    if dist.is_available() and dist.is_initialized():
        # share the default process group's store (it already listens on MASTER_PORT)
        base = dist.distributed_c10d._get_default_store()
    else:
        # under torchrun's agent the agent serves the store: every rank is a client
        serves = job.rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        where = (job.master_addr, job.master_port, job.world_size, job.rank, serves)
        with _stores_lock:
            made = _stores.get(where)
            if made is None:  # one per job and rank, kept for the next connect()
                try:
                    made = _stores[where] = TCPStore(
                        job.master_addr, job.master_port, job.world_size, is_master=serves,
                        timeout=timedelta(seconds=timeout),
                        # as torch's env:// store is: a later init_process_group on
                        # MASTER_PORT shares this server instead of finding the port taken
                        multi_tenant=True,
                    )  # fmt: skip
                except dist.DistStoreError as exc:  # rank 0 waited for the others
                    said = str(exc).strip().splitlines()[0]
                    raise StartupTimeout(
                        f"rank {job.rank}: {said} {startup_hint(job)}."
                    ) from None
        base = made
    return PrefixStore(f"dlcp/{attempt(env)}", base)


#: the TCPStore this process made for a job without a process group, kept for the
#: next connect() (every call made a new one, and rank 0's second could not serve)
_stores: dict[tuple[str, int, int, int, bool], Any] = {}
_stores_lock = threading.Lock()


def attempt(env: Mapping[str, str]) -> str:
    """This run of the ranks: torchrun's restart count (0 without torchrun). The
    agent's store outlives a restart, so each attempt keeps its keys apart from
    the last one's (a restarted rank read the old job id and never heard its
    peers)."""
    count = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    if not count.isdigit():
        raise ConfigError(f"TORCHELASTIC_RESTART_COUNT={count!r} is not a non-negative integer")
    return count


_calls: dict[tuple[str, int], int] = {}
_calls_lock = threading.Lock()


def _call_number(group: str, rank: int) -> int:
    """How many endpoints of ``group`` this rank made on the default store before."""
    with _calls_lock:
        n = _calls.get((group, rank), 0)
        _calls[(group, rank)] = n + 1
    return n


def _release(group: str, rank: int) -> None:
    """Give back the number of a connect() that failed."""
    with _calls_lock:
        _calls[(group, rank)] -= 1


#: rank 0's job id and run nonce per store namespace, as it set them for a connect()
#: that has not succeeded yet (a retry sets the same; the next endpoint, new ones)
_chosen: dict[str, tuple[str, str]] = {}


def connect(
    *,
    group: str = "default",
    store: Store | None = None,
    config: EndpointConfig | None = None,
    authenticate: bool | None = None,
    env: Mapping[str, str] | None = None,
    job_world_size: int | None = None,
) -> tuple[Endpoint, JobInfo]:
    """An :class:`Endpoint` for this rank, its peers found through the store.

    ``job_world_size``: the whole job's number of ranks when ``WORLD_SIZE`` in
    ``env`` is a group's (a subgroup's ranks may sit on several hosts however
    few they are): a loopback address is refused if the job has more ranks
    than ``LOCAL_WORLD_SIZE``.

    ``group`` names the endpoint's namespace in the store, so several endpoints
    (e.g. a DDP hook and a process group) can live in one job. Without ``store``
    (the job's default store), calling again with the same group makes a new
    endpoint with keys of its own; every rank must make its endpoints of a group
    in the same order. A ``store`` passed in is the caller's: one endpoint per
    group in it.

    With authentication the job's secret comes from ``env`` (``DLCP_JOB_SECRET``
    or ``DLCP_JOB_SECRET_FILE``, :func:`dlcp.keyring.job_secret`); without one
    this is a :class:`ConfigError`, before anything is written to the store.
    """
    env = os.environ if env is None else env
    job = env_job(env)
    config = config if config is not None else config_from_env(env)
    if config.host == "127.0.0.1" and "DLCP_HOST" not in env:
        local_world = env.get("LOCAL_WORLD_SIZE", "")  # (torchrun and dlcp launch set it)
        world = job.world_size if job_world_size is None else max(job_world_size, job.world_size)
        beyond = local_world.isdigit() and int(local_world) < world
        config = dataclasses.replace(
            config, host=local_address(job.master_addr, hosts_beyond=beyond)
        )
    # off unless asked for, also for a job with a secret: with it on, a lossless
    # transfer at MTU 1500 keeps 0.65 of its plain throughput on 2-core machines
    # (0.69 with OpenSSL 3.5's libcrypto; docs/security.md), short of the 0.75 that
    # would make it cheap enough to leave on
    auth = config.protocol.authenticate if authenticate is None else authenticate
    if auth != config.protocol.authenticate:  # (the argument over DLCP_AUTHENTICATE)
        config = dataclasses.replace(
            config, protocol=dataclasses.replace(config.protocol, authenticate=auth)
        )
    secret = job_secret(env) if auth else None
    if auth and secret is None:
        raise ConfigError(
            f"authentication is on but the job has no secret: set {SECRET_ENV} (hex, the "
            f"same on every rank; e.g. from `python -c \"import secrets; "
            f"print(secrets.token_hex(32))\"`) or {SECRET_FILE_ENV}; `dlcp launch` sets one "
            "for the ranks it starts. The rendezvous store is readable by anyone who can "
            "reach it, so no key is sent through it"
        )
    numbered = store is None
    if store is None:
        store = _default_store(job, config.timeout, env)
        # the job's one store outlives an endpoint: each connect() of a group gets
        # keys of its own (the ranks make theirs in the same order), or a rank
        # could read the job id and key an earlier endpoint left there
        prefix = f"{group}/{_call_number(group, job.rank)}/"
    else:
        prefix = f"{group}/"
    try:
        if job.rank == 0:
            # chosen once per namespace: a retry after a failure here sets the same
            # values, which a peer may have read already
            job_s, nonce_s = _chosen.setdefault(
                prefix, (str(1 + secrets.randbelow(0xFFFE)), new_run_nonce().hex())
            )
            # the nonce first: a rank that reads the job id finds the nonce there
            store.set(prefix + "nonce", nonce_s)
            store.set(prefix + "job", job_s)
        else:
            _await_rank0(store, prefix + "job", job, config.timeout)
        job_id = int(store.get(prefix + "job"))
        key = None
        if secret is not None:
            nonce = bytes.fromhex(store.get(prefix + "nonce").decode())
            key = KeyRing(secret, job=job_id, run_nonce=nonce)
        endpoint = Endpoint(
            job.rank,
            job=job_id,
            config=config,
            key=key,
            store=_Prefixed(store, prefix),
            world_size=job.world_size,
        )
    except BaseException:
        if numbered:  # a retry takes the same namespace, where its peers are
            _release(group, job.rank)
        raise
    if job.rank == 0:  # another group in another store (or this one again) gets its own
        _chosen.pop(prefix, None)
    return endpoint, job


log = logging.getLogger("dlcp.rendezvous")


def startup_hint(job: JobInfo) -> str:
    """What the ranks wait for at start-up, for an error or notice to say."""
    return (
        f"WORLD_SIZE={job.world_size}: {job.world_size} ranks must start, each with its own "
        f"RANK, MASTER_ADDR={job.master_addr} and MASTER_PORT={job.master_port}; rank 0 "
        "waits in torch's store until they all have joined"
    )


def _await_rank0(store: Any, key: str, job: JobInfo, notice_after: float) -> None:
    """Wait for rank 0 to publish the job (``key``) at most the store's own timeout
    (the process group's, for torch's stores: init_process_group's ``timeout``),
    saying what is awaited once ``notice_after`` seconds (DLCP_TIMEOUT) have gone
    by: with fewer ranks started than WORLD_SIZE, rank 0 never publishes it, and
    this rank waited without a word. A store that cannot wait on a key (a caller's
    own) is left to its ``get``."""
    wait = getattr(store, "wait", None)
    if not callable(wait):
        return
    limit = getattr(store, "timeout", None)
    total = limit.total_seconds() if isinstance(limit, timedelta) else notice_after
    waited = 0.0
    for span in (min(notice_after, total), total - min(notice_after, total)):
        if span <= 0:
            continue
        started = time.monotonic()
        try:
            wait([key], timedelta(seconds=span))
            return
        except Exception:  # torch raises DistStoreError when the wait times out
            if time.monotonic() - started < 0.9 * span:
                raise  # the store failed, it did not time out
        waited += span
        if waited < total:
            log.warning(
                "dlcp rank %d: still waiting for rank 0 after %g s (%s); giving up after %g s",
                job.rank, waited, startup_hint(job), total,
            )  # fmt: skip
    raise StartupTimeout(
        f"rank {job.rank}: rank 0 did not start the job within {waited:g} s. "
        f"{startup_hint(job)}."
    )


class _Prefixed:
    """A store view under a prefix (works for any object with set/get)."""

    def __init__(self, store: Store, prefix: str) -> None:
        self._store = store
        self._prefix = prefix

    def set(self, key: str, value: str | bytes) -> None:
        self._store.set(self._prefix + key, value)

    def get(self, key: str) -> bytes:
        return self._store.get(self._prefix + key)

    def __getattr__(self, name: str) -> Any:
        # wait(keys, timeout) and check(keys), where the store has them: the endpoint
        # then waits for a peer's address at most its own timeout, not the store's
        # (PeerBook.resolve), and its I/O thread not at all (PeerBook.known)
        if name not in ("wait", "check"):
            raise AttributeError(name)
        method = getattr(self._store, name)  # (AttributeError: the store has none)

        def prefixed(keys: list[str], *args: Any) -> Any:
            return method([self._prefix + k for k in keys], *args)

        return prefixed
