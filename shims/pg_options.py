"""How a dlcp process group is configured and finds its peers: the per-group
options (``pg_options=DLCPOptions(...)``) and the environment that
:func:`dlcp.rendezvous.connect` reads, built from what torch hands the group.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from dlcp.collectives import DIRECT_MAX_BYTES
from dlcp.collectives.comm import check_reduce_fill
from dlcp.errors import ConfigError
from dlcp.proto.config import FillPolicy
from dlcp.proto.wire import MAX_LOSS_BOUND

__all__ = ["DLCPOptions", "rendezvous_env", "store_host"]


@dataclass(frozen=True, slots=True)
class DLCPOptions:
    """Per-group options, passed as ``pg_options=`` to ``init_process_group`` / ``new_group``.

    ``p``: loss bound of the reduce-scatter phase of float SUM/AVG all-reduces;
    ``None`` takes ``DLCP_DEFAULT_P`` (0 when unset). ``p_gather``: bound of the
    all-gather phase (keep 0 so that replicas stay identical). ``fill``: what lost
    elements become (``"zero"`` or ``"rescale"``). ``lossy_min_elems``: smaller
    tensors are always reduced with ``p = 0``. ``direct_max_bytes``: an exact
    all-reduce whose copies to every other rank add up to at most this many
    bytes goes in one round (0: always the ring).
    """

    p: float | None = None
    p_gather: float = 0.0
    fill: str = "zero"
    lossy_min_elems: int = 1 << 16
    direct_max_bytes: int = DIRECT_MAX_BYTES

    def __post_init__(self) -> None:
        for name in ("p", "p_gather"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= MAX_LOSS_BOUND:
                raise ConfigError(f"DLCPOptions.{name}={value} outside [0, {MAX_LOSS_BOUND}]")
        if self.p is not None and self.p_gather > self.p:
            raise ConfigError(
                f"DLCPOptions.p_gather={self.p_gather} exceeds p={self.p}: the all-gather's "
                "bound must be the stricter one"
            )
        try:
            fill = FillPolicy(self.fill)
        except ValueError:
            raise ConfigError(
                f"DLCPOptions.fill={self.fill!r}: use one of {[f.value for f in FillPolicy]}"
            ) from None
        try:
            check_reduce_fill(fill, "DLCPOptions.fill")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.lossy_min_elems < 0:
            raise ConfigError(f"DLCPOptions.lossy_min_elems={self.lossy_min_elems} must be >= 0")
        if self.direct_max_bytes < 0:
            raise ConfigError(f"DLCPOptions.direct_max_bytes={self.direct_max_bytes} must be >= 0")


def _base_store(store: Any) -> Any:
    """The store under (possibly several) PrefixStores."""
    for _ in range(16):
        if not isinstance(store, PrefixStore):
            return store
        store = store.underlying_store
    return None


def store_host(store: Any) -> str | None:
    """The host of the TCPStore under (possibly several) PrefixStores, if any."""
    host = getattr(_base_store(store), "host", None)
    return str(host) if host else None


def rendezvous_env(
    store: Any, rank: int, world_size: int, timeout: timedelta | None
) -> Mapping[str, str]:
    """What :func:`dlcp.rendezvous.connect` reads, from torch's arguments: the group's
    rank and size (not the job's), the store's host for picking our address, and the
    group's timeout as the endpoint's unless ``DLCP_TIMEOUT`` is set."""
    env = dict(os.environ)
    env["RANK"], env["WORLD_SIZE"] = str(rank), str(world_size)
    env["MASTER_ADDR"] = store_host(store) or env.get("MASTER_ADDR") or "127.0.0.1"
    # connect() checks it as it does every env:// variable, but with the store
    # given it is not used: init_method "tcp://" or "file://", or store=, may leave
    # it unset (the store's own port, else torch's default port, stands in)
    port = getattr(_base_store(store), "port", None)
    env["MASTER_PORT"] = str(port) if port else "29500"
    if timeout is not None and "DLCP_TIMEOUT" not in env:
        env["DLCP_TIMEOUT"] = repr(max(timeout.total_seconds(), 1.0))
    return env


def job_world_size() -> int | None:
    """The whole job's number of ranks, which a subgroup's creation is not told:
    ``WORLD_SIZE`` if set, else the default group's size once it exists."""
    raw = os.environ.get("WORLD_SIZE", "")
    if raw.isdigit():
        return int(raw)
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return None
