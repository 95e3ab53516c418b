"""The compiled extensions of :mod:`dlcp.io`, or another build of one.

Each is optional (``setup.py``): :func:`load` returns None where it was not
built, and the code it speeds up runs in Python instead. An environment
variable (:data:`BUILD_VARIABLES`) names another build of it to load instead
(:func:`dlcp.builds.alternate_build`): ``make sanitize`` loads the same sources
built with AddressSanitizer and UBSan.
"""

from __future__ import annotations

import functools
from types import ModuleType

from ..builds import alternate_build

__all__ = ["BUILD_VARIABLES", "load"]

#: the variable that names another build of each extension to load
BUILD_VARIABLES = {"_engine": "DLCP_ENGINE_BUILD", "_udpio": "DLCP_UDPIO_BUILD"}


@functools.cache
def load(name: str) -> ModuleType | None:
    """Extension ``dlcp.io.<name>`` (loaded once), from the file its build variable
    names if set; None where it was not built."""
    alternate = alternate_build(f"dlcp.io.{name}", BUILD_VARIABLES[name])
    if alternate is not None:
        return alternate
    try:
        return _BUILT[name]()
    except ImportError:  # built without a C compiler
        return None


def _engine() -> ModuleType:
    from . import _engine as module  # type: ignore[attr-defined]

    return module  # type: ignore[no-any-return]


def _udpio() -> ModuleType:
    from . import _udpio as module  # type: ignore[attr-defined]

    return module  # type: ignore[no-any-return]


#: each extension as this package's build made it (named imports, not strings:
#: tests/tree/test_layering.py)
_BUILT = {"_engine": _engine, "_udpio": _udpio}
