"""torch's own distributed test harness against the ``"dlcp"`` backend, driven
as torch's ``test/distributed/test_distributed_spawn.py`` drives it for Gloo:
``torch.testing._internal.distributed.distributed_test`` with BACKEND and
WORLD_SIZE from the environment, every test in freshly spawned ranks.

    python tests/torch_suite/run_suite.py -v TestDistBackendWithSpawn.test_send_recv
    WORLD_SIZE=2 python tests/torch_suite/run_suite.py -k all_to_all

Needs ``expecttest`` (torch's test utilities import it). Each test spawns
WORLD_SIZE ranks that import torch: tens of seconds per test on a small
machine, so name the tests to run. Not collected by pytest (no ``test_``
prefix). The harness runs some CPU tests only when BACKEND is "gloo", by name;
this runner keeps "dlcp".
"""

from __future__ import annotations

import os

os.environ.setdefault("BACKEND", "dlcp")
os.environ.setdefault("WORLD_SIZE", "3")

from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed.distributed_test import (
    DistributedTest,
    TestDistBackend,
)

import dlcp  # noqa: F401  - registers the backend in every spawned rank too


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):  # type: ignore[misc]
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
