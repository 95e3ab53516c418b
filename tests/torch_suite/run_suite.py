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
check the backend's name then fail on it). It runs its CPU all-to-all tests only
when BACKEND is "mpi": ``DRESS_AS_MPI=1`` does the same for "mpi" (select those
tests, ``-k all_to_all``: the rest of the harness has not been run dressed as MPI).
``TORCH_SUITE_FORK=1`` forks the ranks instead of spawning them.

``full_run.py`` runs the whole harness in chunks and merges the results.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

#: the backend name the harness is shown in place of "dlcp", if any
DRESSED = next(
    (name for name in ("gloo", "mpi") if os.environ.get(f"DRESS_AS_{name.upper()}") == "1"), None
)
os.environ["BACKEND"] = DRESSED or os.environ.get("BACKEND", "dlcp")
os.environ.setdefault("WORLD_SIZE", "3")
#: TORCH_SUITE_FORK=1: fork the ranks from the test process instead of spawning
#: them (each spawned rank imports torch and the harness again: seconds of CPU)
FORK = os.environ.get("TORCH_SUITE_FORK") == "1"

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
        if kwargs.get("backend") == DRESSED:
            kwargs["backend"] = "dlcp"
        return _init_process_group(*args, **kwargs)

    dist.init_process_group = _init_as_dlcp


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):  # type: ignore[misc]
    def setUp(self) -> None:
        super().setUp()
        if FORK:
            self._start_processes(multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


if __name__ == "__main__":
    run_tests()
