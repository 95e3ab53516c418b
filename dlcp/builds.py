"""Another build of a compiled extension, where an environment variable names one.

Each of DLCP's C extensions is optional and is loaded from the package as its build
made it. ``make sanitize`` builds the same sources with AddressSanitizer and UBSan
and names those files in variables (``DLCP_ENGINE_BUILD``, ``DLCP_UDPIO_BUILD``:
:data:`dlcp.io.extensions.BUILD_VARIABLES`; ``DLCP_KERNELS_BUILD``:
:data:`dlcp.proto.kernels.BUILD_VARIABLE`), which the tests then run against.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from types import ModuleType

from .errors import ConfigError

__all__ = ["alternate_build"]


def alternate_build(full: str, variable: str) -> ModuleType | None:
    """Extension module ``full`` (its dotted name) loaded from the file that the
    environment variable ``variable`` names; None where the variable is unset or
    empty. A file that is not such a module raises :class:`ConfigError` naming
    the variable and what it was set to."""
    build = os.environ.get(variable)
    if not build:
        return None
    loader = importlib.machinery.ExtensionFileLoader(full, build)
    spec = importlib.util.spec_from_file_location(full, build, loader=loader)
    try:
        if spec is None:
            raise ImportError("no module spec for it")
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError as exc:
        raise ConfigError(f"{variable}={build!r} is not a build of {full}: {exc}") from exc
    return module
