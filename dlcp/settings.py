"""``DLCP_*`` settings read from the environment, with errors that name the variable.

:meth:`dlcp.io.config.EndpointConfig.from_env` checks every ``DLCP_*`` variable; its
errors speak of the configuration field (``emulated_loss=2.0 outside [0, 1)``).
:func:`config_from_env` says which variable the user set instead
(``DLCP_EMULATED_LOSS=2 outside [0, 1)``), and :func:`check_env` gives that as one
line for a launcher to print before it starts any rank.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .errors import ConfigError
from .io.config import ENV_PREFIX, EndpointConfig

__all__ = ["check_env", "config_from_env"]

#: "field=value " (and the protocol's "protocol configuration: " before it) at the
#: start of a configuration error: the variable and what the user typed replace it
_FIELD = re.compile(r"^(?:protocol configuration: )?[a-z_]+=\S+ ")


def config_from_env(env: Mapping[str, str] | None = None) -> EndpointConfig:
    """The endpoint configuration from ``DLCP_*`` variables; a :class:`ConfigError`
    names the variable at fault and the value it was given."""
    env = os.environ if env is None else env
    try:
        return EndpointConfig.from_env(env)
    except ConfigError as exc:
        raise ConfigError(_blame(env, exc)) from None


def check_env(env: Mapping[str, str] | None = None) -> str | None:
    """None when the ``DLCP_*`` variables make a valid configuration, otherwise
    one line saying which variable is wrong and why."""
    try:
        config_from_env(env)
    except ConfigError as exc:
        return str(exc)
    return None


def _blame(env: Mapping[str, str], exc: ConfigError) -> str:
    ours = sorted(var for var in env if var.startswith(ENV_PREFIX))
    for var in ours:
        try:
            EndpointConfig.from_env({var: env[var]})
        except ConfigError as alone:
            said = str(alone)
            if var in said:  # (an unknown name, a value that does not parse)
                return said
            return f"{var}={env[var]} {_FIELD.sub('', said)}"
    # each is fine alone: they disagree with each other
    return f"{exc} (from {', '.join(f'{var}={env[var]}' for var in ours)})"
