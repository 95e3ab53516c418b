"""The job's secret reaches the ranks out of band: ``dlcp launch`` draws one per
launch and hands it to its ranks in the environment; an authenticated job
without a secret is refused before anything goes to the store."""

from __future__ import annotations

import io
import sys

import pytest

from dlcp import rendezvous
from dlcp.errors import ConfigError
from dlcp.launch import launch
from tests.io.endpoint_helpers import LocalStore

PRINT_SECRET = [sys.executable, "-c", "import os; print(os.environ['DLCP_JOB_SECRET'])"]


def _secrets(env: dict[str, str] | None) -> list[str]:
    out = io.StringIO()
    result = launch(PRINT_SECRET, 2, env=env, stdout=out, prefix=False, timeout=60)
    assert result.returncode == 0, result.message
    return out.getvalue().split()


def test_dlcp_launch_hands_its_ranks_one_fresh_secret() -> None:
    base = {"PATH": "/usr/bin:/bin"}
    first, second = _secrets(base), _secrets(base)
    assert len(first) == 2 and first[0] == first[1]  # every rank of a launch: the same
    assert len(bytes.fromhex(first[0])) == 32
    assert first[0] != second[0]  # a fresh one per launch
    assert "DLCP_JOB_SECRET" not in base  # (not written back)
    # a secret the user gives (one for every host of the job) is kept
    given = {**base, "DLCP_JOB_SECRET": "ab" * 32}
    assert _secrets(given) == ["ab" * 32] * 2


def test_authentication_without_a_secret_is_refused_before_the_store() -> None:
    store = LocalStore()
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    no_secret = r"no secret: set DLCP_JOB_SECRET .* or DLCP_JOB_SECRET_FILE"
    with pytest.raises(ConfigError, match=no_secret):
        rendezvous.connect(group="g", store=store, authenticate=True, env=env)
    assert store._known == {}  # nothing was published
