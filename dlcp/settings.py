"""``DLCP_*`` settings read from the environment, with errors that name the variable.

:meth:`dlcp.io.config.EndpointConfig.from_env` checks every ``DLCP_*`` variable and
says which one the user set (``DLCP_EMULATED_LOSS=2 outside [0, 1)``);
:func:`config_from_env` is that for the process's environment, and :func:`check_env`
gives the error as one line for a launcher to print before it starts any rank
(the job's secret, ``DLCP_JOB_SECRET`` or the file ``DLCP_JOB_SECRET_FILE`` names,
is checked with the rest).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .errors import ConfigError
from .io.config import EndpointConfig
from .keyring import job_secret

__all__ = ["check_env", "config_from_env"]


def config_from_env(env: Mapping[str, str] | None = None) -> EndpointConfig:
    """The endpoint configuration from ``DLCP_*`` variables; a :class:`ConfigError`
    names the variable at fault and the value it was given."""
    return EndpointConfig.from_env(os.environ if env is None else env)


def check_env(env: Mapping[str, str] | None = None) -> str | None:
    """None when the ``DLCP_*`` variables make a valid configuration, otherwise
    one line saying which variable is wrong and why."""
    try:
        config_from_env(env)
        job_secret(env)
    except ConfigError as exc:
        return str(exc)
    return None
