"""torch's own distributed test harness against the ``"dlcp"`` backend, driven
as torch's ``test/distributed/test_distributed_spawn.py`` drives it for Gloo:
``torch.testing._internal.distributed.distributed_test`` with BACKEND and
WORLD_SIZE from the environment, every test in freshly spawned ranks.

    python tests/torch_suite/run_suite.py -v TestDistBackendWithSpawn.test_send_recv
    WORLD_SIZE=2 python tests/torch_suite/run_suite.py -k all_to_all

Needs ``expecttest`` (torch's test utilities import it). Each test spawns
WORLD_SIZE ranks that import torch: tens of seconds per test on a small
machine, so name the tests to run. Not collected by pytest (no ``test_``
prefix). The harness runs some CPU tests only when BACKEND is "gloo", by name:
``DRESS_AS_GLOO=1`` sets BACKEND to "gloo" and has ``init_process_group``
create "dlcp" wherever the harness asks for "gloo", so those run too (tests that
check the backend's name then fail on it).
"""

from __future__ import annotations

import os
from typing import Any

DRESSED = os.environ.get("DRESS_AS_GLOO") == "1"
os.environ["BACKEND"] = "gloo" if DRESSED else os.environ.get("BACKEND", "dlcp")
os.environ.setdefault("WORLD_SIZE", "3")

import torch.distributed as dist  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

import dlcp  # noqa: E402, F401  - registers the backend in every spawned rank too

if DRESSED:  # (in every spawned rank too: each imports this module)
    _init_process_group = dist.init_process_group

    def _init_as_dlcp(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") == "gloo":
            kwargs["backend"] = "dlcp"
        return _init_process_group(*args, **kwargs)

    dist.init_process_group = _init_as_dlcp


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):  # type: ignore[misc]
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
