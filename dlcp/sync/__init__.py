"""Synchronisation schemes on DLCP: one training-loop surface for all of them.

``make(name, model, optimizer, endpoint=ep, world_size=n, **options)`` returns a
:class:`~dlcp.sync.api.SyncScheme`; the loop then calls ``loss.backward();
sync.step()`` and finally ``sync.close()`` (see :mod:`dlcp.sync.api`). Every
setting is checked before any message is sent: an unknown scheme or option, a
negative staleness, a group size that does not divide the workers, a rank
outside the world raise :class:`~dlcp.errors.ConfigError`.

Schemes (:data:`SCHEMES`): ``allreduce`` (BSP all-reduce of gradients, the
baseline, :mod:`dlcp.sync.allreduce`); ``bsp``, ``asp``, ``ssp`` (parameter server,
:mod:`dlcp.sync.ps`); ``eager`` (eager-pull PS with a staleness-aware learning
rate, :mod:`dlcp.sync.eager`); ``vsgd`` (:mod:`dlcp.sync.vsgd`); ``ds-sync``
(:mod:`dlcp.sync.dssync`); ``ripples`` (:mod:`dlcp.sync.ripples`);
``shadow-easgd``, ``shadow-ma``, ``shadow-bmuf`` (:mod:`dlcp.sync.shadow`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..errors import ConfigError
from .allreduce import AllReduceSync
from .api import StepReport, SyncScheme, WorkerFailed
from .dssync import DSSync
from .eager import EagerPullSync
from .ps import ParameterServerSync
from .ripples import Ripples
from .shadow import ShadowSync
from .vsgd import VSGD

__all__ = ["SCHEMES", "StepReport", "SyncScheme", "WorkerFailed", "make"]


def _ps(mode: str) -> Callable[..., SyncScheme]:
    def factory(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **kw: Any) -> SyncScheme:
        if mode != "ssp" and kw.get("staleness", 0) != 0:
            raise ConfigError(f"staleness applies to 'ssp' only, not {mode!r}")
        return ParameterServerSync(model, optimizer, mode=mode, **kw)

    factory.__signature__ = inspect.signature(ParameterServerSync)  # type: ignore[attr-defined]
    return factory


def _shadow(algorithm: str) -> Callable[..., SyncScheme]:
    def factory(model: torch.nn.Module, optimizer: torch.optim.Optimizer, **kw: Any) -> SyncScheme:
        return ShadowSync(model, optimizer, algorithm=algorithm, **kw)

    factory.__signature__ = inspect.signature(ShadowSync)  # type: ignore[attr-defined]
    return factory


#: every scheme make() builds: name -> factory(model, optimizer, **options)
SCHEMES: dict[str, Callable[..., SyncScheme]] = {
    "allreduce": AllReduceSync,
    "bsp": _ps("bsp"),
    "asp": _ps("asp"),
    "ssp": _ps("ssp"),
    "eager": EagerPullSync,
    "vsgd": VSGD,
    "ds-sync": DSSync,
    "ripples": Ripples,
    "shadow-easgd": _shadow("easgd"),
    "shadow-ma": _shadow("ma"),
    "shadow-bmuf": _shadow("bmuf"),
}

_FIXED = {"self", "model", "optimizer", "mode", "algorithm"}


def make(
    name: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **options: Any
) -> SyncScheme:
    """The scheme ``name`` for this rank (module docstring)."""
    factory = SCHEMES.get(name)
    if factory is None:
        raise ConfigError(f"unknown synchronisation scheme {name!r}: one of {', '.join(SCHEMES)}")
    allowed = set(inspect.signature(factory).parameters) - _FIXED
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(
            f"scheme {name!r} takes no option(s) {unknown}; it takes {sorted(allowed)}"
        )
    for needed in ("endpoint", "world_size"):
        if needed in allowed and needed not in options:
            raise ConfigError(f"scheme {name!r} needs {needed}=")
    return factory(model, optimizer, **options)
