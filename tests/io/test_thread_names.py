"""DLCP's threads carry their names into the kernel's view (``top -H``,
``perf``, ``/proc/<pid>/task/*/comm``), where Python 3.11 leaves every thread
of the process called ``python``: the I/O thread of each endpoint and the DDP
hook's transport threads, here two endpoints and one hook state in this process."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from dlcp.io import Endpoint, EndpointConfig
from dlcp.io.threads import OS_NAME_MAX, name_os_thread
from shims.ddp import DLCPState
from tests.io.endpoint_helpers import JOB, LocalStore

pytestmark = pytest.mark.integration


def _os_name(thread: threading.Thread) -> str:
    return Path(f"/proc/self/task/{thread.native_id}/comm").read_text().strip()


def _named(thread: threading.Thread, name: str) -> bool:
    """Whether ``thread`` gets ``name`` in the kernel (it names itself first
    thing when it runs, a moment after ``start()`` returned)."""
    deadline = time.monotonic() + 10
    while _os_name(thread) != name and time.monotonic() < deadline:
        time.sleep(0.01)  # polls the thread's state; not a readiness guess
    return _os_name(thread) == name


def test_a_name_is_cut_to_what_the_kernel_keeps() -> None:
    seen: list[str] = []

    def run() -> None:
        assert name_os_thread("dlcp-a-rather-long-name")
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == ["dlcp-a-rather-long-name"[:OS_NAME_MAX]]


def test_endpoint_and_hook_threads_are_named_for_the_kernel() -> None:
    store = LocalStore()
    cfg = EndpointConfig(timeout=20.0)
    eps = [Endpoint(r, store=store, world_size=2, job=JOB, config=cfg) for r in range(2)]
    state = None
    try:
        state = DLCPState(model=torch.nn.Linear(4, 2), endpoint=eps[0], world_size=2)
        assert _named(eps[0]._thread, "dlcp-io-0")
        assert _named(eps[1]._thread, "dlcp-io-1")
        hook_threads = [t for t in threading.enumerate() if t.name.startswith("dlcp-ddp-hook")]
        assert hook_threads  # (a second starts while the first completes a future)
        assert all(_named(t, "dlcp-ddp-hook") for t in hook_threads)
        assert _os_name(threading.current_thread()) != "dlcp-io-0"  # the caller keeps its own
    finally:
        if state is not None:
            state.close()
        for ep in eps:
            ep.close()
