"""Framework adapters (DDP comm hook, process group): the package ``shims``.

Importing this package does not import torch (nor dlcp). The torch.distributed
backend ``"dlcp"`` is registered by :func:`register` (which imports
torch.distributed), reached in one of these ways (docs/usage.md):

* torch's plugin hook: DLCP's install declares the entry point
  ``dlcp = "shims:torch_autoload"`` in the ``torch.backends`` group
  (pyproject.toml), which ``import torch`` loads and calls once torch.distributed
  is set up (``torch._import_device_backends``), unless
  ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``. Any program of this environment that
  imports torch then has the backend, with or without ``import dlcp``;
* ``import dlcp`` (:func:`register_for_import_of_dlcp`): registers at once if
  torch.distributed is loaded already; if torch is not loaded and its plugin hook
  is switched off, it imports torch to register (torch offers no other supported
  way to run code after a later ``import torch``);
* ``import shims.process_group``, or :func:`register` called by the program.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

__all__ = [
    "BACKEND",
    "autoload_enabled",
    "register",
    "register_for_import_of_dlcp",
    "torch_autoload",
]

#: the torch.distributed backend name
BACKEND = "dlcp"


def register() -> None:
    """Register the ``"dlcp"`` torch.distributed backend (imports torch.distributed;
    idempotent). The process-group module is imported when torch first creates a
    group, not here: registering runs right after torch's import, which may come
    from inside the import of a module of this package."""
    import torch.distributed as dist

    if getattr(dist.Backend, BACKEND.upper(), None) == BACKEND:
        return
    dist.Backend.register_backend(
        BACKEND, _create_group, extended_api=True, devices=["cpu", "cuda"]
    )


def _create_group(backend_opts: Any, pg_options: Any) -> Any:
    """The creator torch calls (extended API) for ``backend="dlcp"``."""
    from .process_group import create_group

    return create_group(backend_opts, pg_options)


def torch_autoload() -> None:
    """The ``torch.backends`` entry point: torch calls it while ``import torch`` runs,
    after torch.distributed is set up. It never raises: torch would turn an
    exception into a failing ``import torch`` for every program of the environment."""
    _register_quietly()


def autoload_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``import torch`` runs the ``torch.backends`` entry points (torch reads
    ``TORCH_DEVICE_BACKEND_AUTOLOAD``; only ``"1"``, the default, enables them)."""
    return environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"


def register_for_import_of_dlcp() -> None:
    """What ``import dlcp`` does: register now if torch.distributed is loaded;
    otherwise leave it to torch's plugin hook, or, with the hook switched off,
    import torch.distributed and register now. Never raises (a torch without
    torch.distributed gets a warning, not a failing ``import dlcp``)."""
    if "torch.distributed" in sys.modules or not autoload_enabled():
        _register_quietly()


def _register_quietly() -> None:
    try:
        register()
    except Exception as exc:  # torch without distributed support, or an odd build
        warnings.warn(
            f"dlcp: backend 'dlcp' not registered with torch.distributed: {exc!r}",
            RuntimeWarning,
            stacklevel=3,
        )
