"""Settings shared by the whole suite.

Hypothesis's default deadline (200 ms an example) measures the machine, not the
code: on a machine whose cores are busy with other jobs an example of the
pacer's property tests took longer and the run failed. The properties here are
about values, never about time, so no example has a deadline."""

import dataclasses
import os
from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("dlcp", deadline=None)
settings.load_profile("dlcp")


@pytest.fixture(autouse=True)
def _engine_threads_from_the_environment(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DLCP_ENGINE_THREADS=N pytest ...`` runs every native endpoint a test
    makes on N send threads, those whose ``EndpointConfig`` the test builds
    itself included (a config built directly reads no environment; only
    ``EndpointConfig.from_env`` does), unless the test chose a count other than 1
    or the Python engine, or is marked ``one_send_thread``. Processes a test
    starts inherit the variable."""
    raw = os.environ.get("DLCP_ENGINE_THREADS")
    if raw is None or request.node.get_closest_marker("one_send_thread") is not None:
        return
    from dlcp.io import endpoint as endpoint_module
    from dlcp.io.config import EndpointConfig

    threads = EndpointConfig.from_env({"DLCP_ENGINE_THREADS": raw}).engine_threads
    made = endpoint_module.Endpoint.__init__

    def make(self: Any, *args: Any, config: EndpointConfig | None = None, **kw: Any) -> None:
        if config is not None and config.engine != "python" and config.engine_threads == 1:
            config = dataclasses.replace(config, engine_threads=threads)
        made(self, *args, config=config, **kw)

    monkeypatch.setattr(endpoint_module.Endpoint, "__init__", make)
