"""Framework adapters (DDP comm hook, process group): the package ``shims``.

Importing this package does not import torch. :func:`register` makes
``torch.distributed.init_process_group(backend="dlcp")`` available (it imports
torch); :func:`register_when_torch_loads`, which ``import dlcp`` calls, does the
same without importing torch: at once if torch is loaded already, otherwise
right after the program's own ``import torch`` has finished.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["BACKEND", "register", "register_when_torch_loads"]

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


def register_when_torch_loads() -> None:
    """Register the backend now if torch is loaded, else once ``import torch`` completes.

    Never imports torch, never raises: a torch without torch.distributed gets a
    warning, not a failing ``import dlcp``.
    """
    if "torch.distributed" in sys.modules:
        _register_quietly()
    elif "torch" not in sys.modules and not any(
        isinstance(f, _AfterTorchImport) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _AfterTorchImport())


def _register_quietly() -> None:
    try:
        register()
    except Exception as exc:  # torch without distributed support, or an odd build
        warnings.warn(
            f"dlcp: backend 'dlcp' not registered with torch.distributed: {exc!r}",
            RuntimeWarning,
            stacklevel=3,
        )


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds ``torch`` through the other finders and wraps its loader, so that the
    backend is registered right after torch's ``__init__`` has run. It leaves
    ``sys.meta_path`` once torch is loaded (a mere ``find_spec("torch")`` probe
    does not disarm it)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != "torch":
            return None
        for finder in list(sys.meta_path):
            find = None if finder is self else getattr(finder, "find_spec", None)
            spec: ModuleSpec | None = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _RegisterAfterExec(spec.loader, self)
        return spec


class _RegisterAfterExec(importlib.abc.Loader):
    def __init__(self, inner: Any, finder: _AfterTorchImport) -> None:
        self._inner = inner
        self._finder = finder

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._inner.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        # torch sees its own loader
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        _register_quietly()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
